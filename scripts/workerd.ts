/**
 * The edge Worker in workerd outside `wrangler dev`: bundled as `wrangler
 * deploy` bundles it, run by Miniflare with wrangler.toml's runtime, served
 * on a socket of its own. Shared by `npm start`, the edge's integration
 * tests, the edge benchmarks and `npm run check:bundle`.
 */
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Miniflare } from "miniflare";
import { freePort } from "../common/free-ports.ts";
import { REPO } from "../common/processes.ts";

export const WRANGLER = join(REPO, "node_modules", "wrangler", "bin", "wrangler.js");

/** Bundles a Worker the way `wrangler deploy` does; returns the entry module's path. */
export function bundleWorker(config: string, outdir: string, entry: string): string {
  const r = spawnSync(
    process.execPath,
    [WRANGLER, "deploy", "--dry-run", "--config", config, "--outdir", outdir],
    {
      cwd: REPO,
      encoding: "utf8",
    },
  );
  if (r.status !== 0) throw new Error(`wrangler deploy --dry-run failed:\n${r.stdout}\n${r.stderr}`);
  return join(outdir, entry);
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
