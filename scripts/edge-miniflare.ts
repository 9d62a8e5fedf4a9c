/**
 * The edge Worker in workerd through Miniflare, served on a socket of its
 * own: what `npm start` runs (scripts/local-stack/edge.ts) and what the
 * edge's load tests and benchmarks run (startEdgeMiniflare in
 * scripts/edge-harness.ts). One copy, so the local stack serves the edge the
 * tests measured.
 *
 * Not `wrangler dev`: its ProxyWorker (a second workerd relaying over HTTP
 * in front of the Worker) caps a Worker at about 65 req/s on these machines,
 * now and then does not pass a client's hang-up on, and under 300
 * concurrent streams from one client ran workerd out of file descriptors
 * until it was restarted (docs/edge.md, "Running it").
 */
import { join } from "node:path";
import type { Miniflare, MiniflareOptions } from "miniflare";
import { REPO } from "../common/processes.ts";
import { bundleIsCurrent, bundleWorkerAsync, runtimeOf, varsOf } from "./workerd.ts";

/**
 * The names `wrangler dev` gives the Worker and its KV namespace (from
 * wrangler.toml): Miniflare keys its stored Durable Objects by the first and
 * its stored KV by the second, so a state directory written by `wrangler dev
 * --persist-to DIR` and one written here are the same directory.
 */
const WORKER_NAME = "llmgw-edge";
const KV_ID = "llmgw-kv-local";

export interface ServeEdgeOptions {
  /** The wrangler.toml to bundle and take the runtime from. */
  config: string;
  /** Where the bundle is written. */
  outdir: string;
  /** The bundled entry module's file name in `outdir`. */
  entry: string;
  /** Keep a bundle already in `outdir` that is newer than all it was built from (bundleIsCurrent). */
  reuseBundle?: boolean;
  /** The Worker's own socket on 127.0.0.1: the edge's URL. */
  port: number;
  /** Miniflare's entry worker's port (0: any); nothing is served through it. */
  entryPort?: number;
  /** Worker vars and secrets, laid over the config's `[vars]`; an undefined value leaves that binding unset. */
  bindings: Record<string, string | undefined>;
  /**
   * Keep KV and Durable Objects under this directory across restarts, laid
   * out as `wrangler dev --persist-to` lays them out. Absent: in memory.
   */
  persistTo?: string;
  /** Every line the Worker and workerd log. */
  onLog(level: string, message: string): void;
}

export interface EdgeServer {
  /** The Worker's own socket, e.g. http://127.0.0.1:8787. */
  url: string;
  mf: Miniflare;
  dispose(): Promise<void>;
}

export async function serveEdge(o: ServeEdgeOptions): Promise<EdgeServer> {
  // Loading Miniflare takes seconds of CPU, as does wrangler's bundling in
  // its own process: side by side. (Miniflare at the version wrangler
  // brings, pinned so in package.json: the same workerd build.)
  const reuse =
    o.reuseBundle && bundleIsCurrent(o.config, o.outdir, o.entry, join(REPO, "package-lock.json"));
  const [script, { Miniflare }] = await Promise.all([
    reuse ? join(o.outdir, o.entry) : bundleWorkerAsync(o.config, o.outdir, o.entry),
    import("miniflare"),
  ]);
  const options: MiniflareOptions = {
    ...runtimeOf(o.config),
    name: WORKER_NAME,
    host: "127.0.0.1",
    port: o.entryPort ?? 0,
    modules: true,
    scriptPath: script,
    modulesRoot: o.outdir,
    kvNamespaces: { LLMGW_KV: KV_ID },
    durableObjects: {
      KEY_LEDGER: { className: "KeyLedger", useSQLite: true },
      REVOCATIONS: { className: "RevocationLog", useSQLite: true },
      MODEL_POOL: { className: "ModelPool", useSQLite: true },
    },
    bindings: definedOnly({ ...varsOf(o.config), ...o.bindings }),
    structuredWorkerdLogs: true,
    // Miniflare checks that this returns nothing: a stream write's boolean
    // returned from here kills the process.
    handleStructuredLogs: ({ level, message }: { level: string; message: string }) => {
      o.onLog(level, message);
    },
    // Miniflare's entry worker runs JavaScript at the start of every
    // response, which Cloudflare's front line does not: the Worker is
    // served on a socket of its own.
    unsafeDirectSockets: [{ host: "127.0.0.1", port: o.port }],
    ...(o.persistTo ? { defaultPersistRoot: join(o.persistTo, "v3") } : {}),
  };
  const mf = new Miniflare(options);
  await mf.ready;
  const url = String(await mf.unsafeGetDirectURL()).replace(/\/$/, "");
  return { url, mf, dispose: () => mf.dispose() };
}

function definedOnly(vars: Record<string, string | undefined>): Record<string, string> {
  return Object.fromEntries(Object.entries(vars).filter((e): e is [string, string] => e[1] !== undefined));
}
