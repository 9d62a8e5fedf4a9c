import { buildDashboard } from "../../scripts/build-dashboard.ts";

/** Every test run serves the dashboard as the sources are now, with no build step before `npm test`. */
export default async function setup(): Promise<void> {
  await buildDashboard();
}
