/**
 * The browser the dashboard's tests drive: the headless Chromium that the
 * `@sparticuz/chromium` dev dependency ships inside its npm package, so
 * `npm ci` brings it and nothing is downloaded or installed with apt.
 * `$LLMGW_CHROMIUM` names another binary instead (Debian's /usr/bin/chromium,
 * for one).
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { inflate } from "@sparticuz/chromium";
import { type Browser, chromium, type Page } from "playwright-core";
import { REPO } from "./process.ts";

/** Screenshots the browser tests keep (gitignored). */
export const ARTIFACTS = join(REPO, "test", "artifacts");

const PACKAGE = join(REPO, "node_modules", "@sparticuz", "chromium");

/** The brotli files in the package: the binary, its fonts, its software GL, and NSS/NSPR/expat libraries. */
const PACKED = ["chromium.br", "fonts.tar.br", "swiftshader.tar.br", "al2023.tar.br"];

/** A browser to launch: its binary and what its environment needs on top of ours. */
export interface ChromiumBinary {
  path: string;
  env: Record<string, string>;
}

/**
 * The packaged Chromium, unpacked once under node_modules/.cache (so `npm ci`
 * starts it afresh) into a directory of its own: into a private staging
 * directory first, then renamed into place, so test workers and other
 * checkouts racing here never launch a half-written binary, and the
 * package's own default (/tmp/chromium, shared by every user of the machine)
 * is never read. The libraries from its al2023 archive (NSS, NSPR, expat)
 * make it run on a machine with none of Chromium's apt dependencies.
 * Idempotent and safe to race.
 */
export async function unpackChromium(): Promise<ChromiumBinary> {
  const version = JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8")).version as string;
  const cache = join(REPO, "node_modules", ".cache", "llmgw-chromium");
  const dir = join(cache, version);
  const binary: ChromiumBinary = {
    path: join(dir, "chromium"),
    env: { LD_LIBRARY_PATH: join(dir, "al2023", "lib"), FONTCONFIG_FILE: join(dir, "fonts.conf") },
  };
  if (existsSync(binary.path)) return binary;
  mkdirSync(cache, { recursive: true });
  const staging = mkdtempSync(join(cache, `${version}.unpacking-`));
  try {
    await inflateInto(staging);
    // The package's fonts.conf names /tmp/fonts; ours names where the fonts are.
    writeFileSync(
      join(staging, "fonts.conf"),
      `<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n  <dir>${join(dir, "fonts", "fonts")}</dir>\n  <cachedir>${join(dir, "fonts-cache")}</cachedir>\n</fontconfig>\n`,
    );
    try {
      renameSync(staging, dir);
    } catch (err) {
      // Another process finished first: its copy is as good as ours.
      if (!existsSync(binary.path)) throw err;
    }
  } finally {
    rmSync(staging, { recursive: true, force: true });
  }
  return binary;
}

/**
 * The package's inflate() writes under os.tmpdir(), which it reads when each
 * call starts; pointing TMPDIR at the staging directory for those
 * synchronous starts is the one way to choose where the files land.
 */
async function inflateInto(staging: string): Promise<void> {
  const saved = process.env.TMPDIR;
  process.env.TMPDIR = staging;
  let pending: Promise<string>[];
  try {
    pending = PACKED.map((file) => inflate(join(PACKAGE, "bin", file)));
  } finally {
    if (saved === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = saved;
  }
  await Promise.all(pending);
}

/** The binary tests launch: `$LLMGW_CHROMIUM` if set, else the packaged one. */
export async function chromiumBinary(): Promise<ChromiumBinary> {
  const named = process.env.LLMGW_CHROMIUM;
  if (named) return { path: named, env: {} };
  return unpackChromium();
}

/**
 * Headless Chromium with every background service off: on a closed network
 * its update, sync and QUIC probes fail and can stall a launch. Playwright
 * gives each launch a fresh temporary profile (--user-data-dir).
 */
export async function launchChromium(options: { locale?: string } = {}): Promise<Browser> {
  const binary = await chromiumBinary();
  const env: Record<string, string> = { ...stringEnv(), ...binary.env };
  const args = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ];
  if (options.locale !== undefined) {
    // The language the page sees (navigator.language) follows the process's locale, as on a terminal.
    env.LANG = options.locale;
    env.LC_ALL = options.locale;
    args.push(`--lang=${options.locale}`);
  }
  return chromium.launch({ executablePath: binary.path, headless: true, env, args });
}

function stringEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined) env[k] = v;
  return env;
}

/** Saves a full-page screenshot as test/artifacts/<dir>/<name>.png and returns its path. */
export async function screenshot(page: Page, dir: string, name: string): Promise<string> {
  mkdirSync(join(ARTIFACTS, dir), { recursive: true });
  const path = join(ARTIFACTS, dir, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}
