/**
 * `npm run check:bundle` (run by .ci/run): builds the edge Worker exactly as
 * `wrangler deploy` would upload it (`--dry-run --outdir`, no account
 * needed) and prints its size beside Workers' limits. Fails when the build
 * fails or the bundle is over the Paid plan's limit.
 *
 * The limit is on the compressed upload: 3 MiB on Workers Free, 10 MiB on
 * Workers Paid. The size here is gzip at zlib's default level of every
 * module wrangler would upload, the figure wrangler prints as "gzip".
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { bundleWorker } from "./workerd.ts";

const MiB = 1024 * 1024;
const LIMITS = [
  { plan: "Workers Free", bytes: 3 * MiB },
  { plan: "Workers Paid", bytes: 10 * MiB },
];

const repo = join(import.meta.dirname, "..");

function check(out: string): number {
  try {
    bundleWorker(join(repo, "wrangler.toml"), out, "worker.js");
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    return 1;
  }
  // What wrangler uploads: the modules, not the source map or its README.
  const modules = readdirSync(out).filter((f) => !f.endsWith(".map") && f !== "README.md");
  let raw = 0;
  let gzip = 0;
  for (const f of modules) {
    const bytes = readFileSync(join(out, f));
    raw += bytes.length;
    gzip += gzipSync(bytes).length;
  }
  const kib = (n: number) => `${(n / 1024).toFixed(1)} KiB`;
  console.log(`edge Worker bundle (wrangler deploy --dry-run): ${modules.join(", ")}`);
  console.log(`  ${kib(raw)} uncompressed, ${kib(gzip)} gzip`);
  for (const l of LIMITS) {
    console.log(
      `  ${l.plan} limit: ${l.bytes / MiB} MiB compressed, ${((gzip / l.bytes) * 100).toFixed(1)} % used`,
    );
  }
  if (gzip > LIMITS.at(-1)!.bytes) {
    console.error("over the Workers Paid limit: wrangler deploy would be refused");
    return 1;
  }
  return 0;
}

const out = mkdtempSync(join(tmpdir(), "llmgw-edge-bundle-"));
try {
  process.exitCode = check(out);
} finally {
  rmSync(out, { recursive: true, force: true });
}
