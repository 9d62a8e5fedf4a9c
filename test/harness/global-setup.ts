import { buildDashboard } from "../../scripts/build-dashboard.ts";
import { chromiumBinary } from "./browser.ts";

/**
 * Every test run serves the dashboard as the sources are now, with no build
 * step before `npm test`; the browser is unpacked here, once, so no browser
 * test spends its own deadline on it.
 */
export default async function setup(): Promise<void> {
  await Promise.all([buildDashboard(), chromiumBinary()]);
}
