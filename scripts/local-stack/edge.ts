/**
 * `npm start`'s edge: the Worker in workerd through Miniflare, on the
 * stack's edge port (serveEdge, the code the edge's load tests run), with
 * KV and Durable Objects kept under `<state-dir>/edge` as `wrangler dev
 * --persist-to` keeps them. A process of its own, so the stack prefixes its
 * log and stops it like every other child.
 *
 *   node --import tsx scripts/local-stack/edge.ts --port N --state-dir DIR
 *
 * The EdgeSync secret comes from LLMGW_EDGE_TOKEN (never argv, which any
 * local user can read in /proc), and with several sites their tokens from
 * LLMGW_EDGE_SITE_TOKENS, bound as EDGE_SYNC_SITE_TOKENS, and LLMGW_LOCATION_HEADER
 * ("1": the x-llmgw-location header stands in for request.cf; docs/sites.md).
 * Miniflare stops workerd when this process is signalled or exits.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { errorMessage } from "../../common/log.ts";
import { REPO } from "../../common/processes.ts";
import { serveEdge } from "../edge-miniflare.ts";

async function main(): Promise<void> {
  const { values } = parseArgs({
    strict: true,
    options: { port: { type: "string" }, "state-dir": { type: "string" } },
  });
  const port = Number(values.port);
  const stateDir = values["state-dir"];
  const token = process.env.LLMGW_EDGE_TOKEN;
  if (!Number.isInteger(port) || port < 1 || port > 65535 || !stateDir)
    throw new Error("usage: edge.ts --port N --state-dir DIR");
  if (!token) throw new Error("LLMGW_EDGE_TOKEN is not set: EdgeSync would refuse every call");
  // A stack killed without a chance to stop us (SIGKILL) re-parents us:
  // exit, and workerd with us, rather than hold the edge port for nobody.
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) process.exit(0);
  }, 1_000).unref();
  const dir = join(stateDir, "edge");
  const outdir = join(dir, "bundle");
  mkdirSync(outdir, { recursive: true });
  const edge = await serveEdge({
    config: join(REPO, "wrangler.toml"),
    outdir,
    entry: "worker.js",
    reuseBundle: true,
    port,
    // wrangler.toml's [vars] as they are, as `wrangler dev` binds them.
    bindings: {
      EDGE_SYNC_TOKEN: token,
      EDGE_SYNC_SITE_TOKENS: process.env.LLMGW_EDGE_SITE_TOKENS,
      LLMGW_LOCATION_HEADER: process.env.LLMGW_LOCATION_HEADER,
    },
    persistTo: dir,
    onLog: (level, message) =>
      (level === "error" || level === "warn" ? process.stderr : process.stdout).write(`${message}\n`),
  });
  // The line `npm start` waits for.
  process.stdout.write(`edge ready on ${edge.url}\n`);
}

main().catch((err) => {
  process.stderr.write(`edge: ${errorMessage(err)}\n`);
  process.exit(1);
});
