/**
 * The edge Worker in workerd outside `wrangler dev`: bundled as `wrangler
 * deploy` bundles it, run by Miniflare with wrangler.toml's runtime, served
 * on a socket of its own. Shared by `npm start`, the edge's integration
 * tests, the edge benchmarks and `npm run check:bundle`.
 */
import { execFile, spawnSync } from "node:child_process";
import { readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import type { Miniflare } from "miniflare";
import { freePort } from "../common/free-ports.ts";
import { REPO } from "../common/processes.ts";

export const WRANGLER = join(REPO, "node_modules", "wrangler", "bin", "wrangler.js");

const bundleArgs = (config: string, outdir: string) => [
  WRANGLER,
  "deploy",
  "--dry-run",
  "--config",
  config,
  "--outdir",
  outdir,
];
const bundleFailed = (stdout: string, stderr: string) =>
  new Error(`wrangler deploy --dry-run failed:\n${stdout}\n${stderr}`);

/** Bundles a Worker the way `wrangler deploy` does; returns the entry module's path. */
export function bundleWorker(config: string, outdir: string, entry: string): string {
  const r = spawnSync(process.execPath, bundleArgs(config, outdir), { cwd: REPO, encoding: "utf8" });
  if (r.status !== 0) throw bundleFailed(r.stdout, r.stderr);
  return join(outdir, entry);
}

/** bundleWorker without blocking: the caller loads Miniflare meanwhile. */
export async function bundleWorkerAsync(config: string, outdir: string, entry: string): Promise<string> {
  await promisify(execFile)(process.execPath, bundleArgs(config, outdir), { cwd: REPO }).catch(
    (err: { stdout?: string; stderr?: string }) => {
      throw bundleFailed(err.stdout ?? "", err.stderr ?? String(err));
    },
  );
  return join(outdir, entry);
}

/**
 * Whether `outdir` already holds the bundle of `config`: its entry module is
 * newer than every file it was built from — the sources its source map
 * lists (node_modules included), the config, and the lockfile, which
 * changes whenever the installed packages do. `npm start` keeps its bundle
 * in the state directory and skips wrangler's seconds of bundling on a
 * restart with nothing changed.
 */
export function bundleIsCurrent(config: string, outdir: string, entry: string, lockfile: string): boolean {
  const script = join(outdir, entry);
  let built: number;
  let sources: string[];
  try {
    built = statSync(script).mtimeMs;
    const map = JSON.parse(readFileSync(`${script}.map`, "utf8")) as { sources?: unknown };
    if (!Array.isArray(map.sources) || map.sources.length === 0) return false;
    sources = map.sources.map((s) => resolve(outdir, String(s)));
  } catch {
    return false;
  }
  return [config, lockfile, ...sources].every((f) => {
    try {
      return statSync(f).mtimeMs < built;
    } catch {
      return false; // gone: what imported it changed too, but say so plainly
    }
  });
}

/** compatibility_date and _flags of a wrangler.toml, so Miniflare runs what wrangler would. */
export function runtimeOf(config: string): { compatibilityDate: string; compatibilityFlags: string[] } {
  const text = readFileSync(config, "utf8");
  const date = /^compatibility_date\s*=\s*"([^"]+)"/m.exec(text)?.[1];
  const flags = /^compatibility_flags\s*=\s*\[([^\]]*)\]/m.exec(text)?.[1] ?? "";
  if (!date) throw new Error(`${config}: no compatibility_date`);
  return { compatibilityDate: date, compatibilityFlags: [...flags.matchAll(/"([^"]+)"/g)].map((m) => m[1]!) };
}

/**
 * The `[vars]` of a wrangler.toml, as `wrangler dev` would bind them: one
 * `NAME = "string"` (or `'literal'`) a line, which is all the edge's
 * wrangler.toml uses; anything else in the section is refused rather than
 * silently left unbound.
 */
export function varsOf(config: string): Record<string, string> {
  return varsIn(readFileSync(config, "utf8"), config);
}

/** varsOf over a wrangler.toml's text; `where` names it in errors. */
export function varsIn(toml: string, where: string): Record<string, string> {
  const lines = toml.split("\n");
  const start = lines.findIndex((l) => l.trim() === "[vars]");
  const vars: Record<string, string> = {};
  if (start < 0) return vars;
  for (const raw of lines.slice(start + 1)) {
    const line = raw.trim();
    if (line.startsWith("[")) break;
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*("(?:[^"\\]|\\.)*"|'[^']*')\s*(?:#.*)?$/.exec(line);
    if (!m) throw new Error(`${where}: [vars]: cannot read "${line}" (NAME = "string" expected)`);
    vars[m[1]!] = m[2]!.startsWith("'") ? m[2]!.slice(1, -1) : (JSON.parse(m[2]!) as string);
  }
  return vars;
}

/**
 * Serves a Miniflare Worker on a socket of its own as well as Miniflare's:
 * Miniflare's entry worker (local-dev pretty errors, live reload, request
 * logging) runs JavaScript at the start of every response, which Cloudflare's
 * front line does not; a benchmark measuring what a Worker adds must not
 * count it. Returns the options to spread into `new Miniflare` and, once
 * ready, the direct URL.
 */
export async function directSocket(): Promise<{
  options: { unsafeDirectSockets: { host: string; port: number }[] };
  url(mf: Miniflare): Promise<string>;
}> {
  const port = await freePort();
  return {
    options: { unsafeDirectSockets: [{ host: "127.0.0.1", port }] },
    url: async (mf) => String(await mf.unsafeGetDirectURL()).replace(/\/$/, ""),
  };
}
