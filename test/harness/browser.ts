import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { type Browser, chromium, type Page } from "playwright-core";
import { REPO } from "./process.ts";

/** Debian's chromium package (`apt-get install chromium`); playwright downloads no browser. */
export const CHROMIUM = process.env.LLMGW_CHROMIUM ?? "/usr/bin/chromium";

/** Screenshots the browser tests keep (gitignored). */
export const ARTIFACTS = join(REPO, "test", "artifacts");

/**
 * Headless Chromium with every background service off: on a closed network
 * its update, sync and QUIC probes fail and can stall a launch. Playwright
 * gives each launch a fresh temporary profile (--user-data-dir).
 */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

/** Saves a full-page screenshot as test/artifacts/<dir>/<name>.png and returns its path. */
export async function screenshot(page: Page, dir: string, name: string): Promise<string> {
  mkdirSync(join(ARTIFACTS, dir), { recursive: true });
  const path = join(ARTIFACTS, dir, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}
