import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildDashboard } from "../../scripts/build-dashboard.ts";
import { chromiumBinary } from "./browser.ts";

/**
 * Every test run serves the dashboard as the sources are now, with no build
 * step before `npm test`; the browser is unpacked here, once, so no browser
 * test spends its own deadline on it.
 *
 * The run gets a temporary directory of its own, removed when it ends: the
 * tests, and every process they start (control planes, agents, workerd,
 * Chromium), make theirs under it, so a run leaves nothing behind in the
 * machine's /tmp, even from a test that failed before its cleanup.
 */
export default async function setup(): Promise<() => void> {
  const root = mkdtempSync(join(tmpdir(), "llmgw-test-run-"));
  process.env.TMPDIR = root;
  await Promise.all([buildDashboard(), chromiumBinary()]);
  return () => rmSync(root, { recursive: true, force: true });
}
