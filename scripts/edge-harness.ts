/**
 * The edge and sim engines on loopback, as the edge's integration tests and
 * the edge and routing benchmarks run them: the Worker under `wrangler dev`
 * or in Miniflare as `npm start` serves it (edge-miniflare.ts), EdgeSync,
 * keys, endpoint sets.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
// Miniflare at the version wrangler brings (package.json pins it so): the same workerd build.
import { Miniflare } from "miniflare";
import OpenAI from "openai";
import { hashSecret, newSecret } from "../cli/ctl/keys.ts";
import { type EdgeSyncClient, edgeSyncClient } from "../common/edgesync-client.ts";
import { freePort } from "../common/free-ports.ts";
import { type Proc, REPO, startLlmgw, startProcess } from "../common/processes.ts";
import { ACCESS_LOG_TYPE, type AccessEntry } from "../edge/access-log.ts";
import { serveEdge } from "./edge-miniflare.ts";
import { bundleWorker, directSocket, runtimeOf, WRANGLER } from "./workerd.ts";

/**
 * The real edge in workerd (`wrangler dev`, driven as a black box) and real
 * sim engines, for the edge's integration tests. One edge per test file:
 * its own port, its own `--persist-to` directory, its own EdgeSync secret.
 */

export interface Edge {
  url: string;
  token: string;
  proc: Proc;
  sync: EdgeSyncClient;
  stop(): Promise<void>;
}

/** Where a `wrangler dev` listens and keeps its state; by default a free port and a directory of its own. */
export interface WranglerPlace {
  port?: number;
  /** A state directory the caller owns: kept on stop, so a restart finds KV and Durable Objects as they were. */
  persistTo?: string;
}

/** `wrangler dev` for a config, on a free port with its own state directory. */
export async function startWrangler(
  config: string,
  vars: Record<string, string>,
  name: string,
  place: WranglerPlace = {},
): Promise<{ url: string; proc: Proc; stop(): Promise<void> }> {
  const port = place.port ?? (await freePort());
  const inspector = await freePort();
  const dir = place.persistTo ?? mkdtempSync(join(tmpdir(), "llmgw-wrangler-"));
  const proc = startProcess(name, process.execPath, [
    WRANGLER,
    "dev",
    "--config",
    config,
    "--ip",
    "127.0.0.1",
    "--port",
    String(port),
    "--inspector-port",
    String(inspector),
    "--persist-to",
    dir,
    "--show-interactive-dev-session=false",
    ...Object.entries(vars).flatMap(([k, v]) => ["--var", `${k}:${v}`]),
  ]);
  await readyOrKilled(proc, /Ready on http/, 60_000);
  return {
    url: `http://127.0.0.1:${port}`,
    proc,
    async stop() {
      await proc.kill();
      if (!place.persistTo) rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface EdgeOptions extends WranglerPlace {
  /** The EdgeSync secret; default a fresh one. */
  token?: string;
  /** More Worker vars (EDGE_SYNC_TOKEN_NEXT, …); an empty EDGE_SYNC_TOKEN here unsets it. */
  vars?: Record<string, string>;
}

export async function startEdge(
  router: Record<string, unknown> = {},
  name = "edge",
  opts: EdgeOptions = {},
): Promise<Edge> {
  const token = opts.token ?? `edge-test-${Math.random().toString(36).slice(2)}`;
  const w = await startWrangler(
    join(REPO, "wrangler.toml"),
    { EDGE_SYNC_TOKEN: token, LLMGW_ROUTER: JSON.stringify(router), ...opts.vars },
    name,
    opts,
  );
  return track({ url: w.url, token, proc: w.proc, sync: edgeSyncClient(w.url, token), stop: w.stop });
}

export type FastEdge = Omit<Edge, "proc"> & {
  /** Miniflare's own port (its entry worker); `url` is the Worker's direct socket. */
  port: number;
  /** What the Worker and workerd logged so far, but the access log: one entry a line. */
  logged: string[];
  /**
   * The access log so far: where each request was finally served, which a
   * stream committed at its first engine's headers tells its client only in
   * those headers.
   */
  access: AccessEntry[];
};

/**
 * Miniflare runs workerd inside the test process: its access log (a line
 * per request, for operators) would bury the test report, so it is dropped
 * there; the Worker's other lines still show.
 */
const withoutAccessLog =
  (logged: string[] = [], access: AccessEntry[] = []) =>
  (level: string, message: string): void => {
    if (message.startsWith(`{"type":"${ACCESS_LOG_TYPE}"`)) {
      access.push(JSON.parse(message) as AccessEntry);
      return;
    }
    logged.push(message);
    (level === "error" || level === "warn" ? process.stderr : process.stdout).write(`${message}\n`);
  };

/**
 * The edge in workerd through Miniflare (serveEdge, what `npm start` runs),
 * bundled as `wrangler deploy` bundles it, state in memory, served on a
 * direct socket. Unlike `wrangler dev` there is no ProxyWorker in front (a
 * second workerd relaying over HTTP), which caps `wrangler dev` at about 65
 * req/s on these machines and now and then does not pass a client's hang-up
 * on. For benchmarks and load tests.
 */
export async function startEdgeMiniflare(
  router: Record<string, unknown> = {},
  /** More bindings (EDGE_SYNC_TOKEN_NEXT, …); `EDGE_SYNC_TOKEN: undefined` leaves it unset. */
  vars: Record<string, string | undefined> = {},
  /** Another entry module in place of edge/worker.ts (a benchmark's variant of the edge), bundled with the edge's wrangler.toml. */
  entry?: string,
): Promise<FastEdge> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-edge-mf-"));
  let config = join(REPO, "wrangler.toml");
  if (entry) {
    const text = readFileSync(config, "utf8").replace(/^main = ".*"$/m, `main = ${JSON.stringify(entry)}`);
    config = join(dir, "wrangler.toml");
    writeFileSync(config, text);
  }
  const token = newSecret();
  const port = await freePort();
  const logged: string[] = [];
  const access: AccessEntry[] = [];
  const edge = await serveEdge({
    config,
    outdir: dir,
    entry: `${basename(entry ?? "worker.ts", ".ts")}.js`,
    port: await freePort(),
    entryPort: port,
    bindings: { EDGE_SYNC_TOKEN: token, LLMGW_ROUTER: JSON.stringify(router), ...vars },
    onLog: withoutAccessLog(logged, access),
  });
  return track({
    url: edge.url,
    port,
    token,
    logged,
    access,
    sync: edgeSyncClient(edge.url, token),
    async stop() {
      await edge.dispose();
      rmSync(dir, { recursive: true, force: true });
    },
  });
}

/**
 * The official openai client against an edge, as an API user would
 * configure it (no SDK retries, so a test sees every status); `fetch` in
 * place of the global one, for a caller that stamps its requests.
 */
export function clientFor(edge: { url: string }, apiKey: string, fetch?: typeof globalThis.fetch): OpenAI {
  return new OpenAI({ apiKey, baseURL: `${edge.url}/v1`, maxRetries: 0, ...(fetch ? { fetch } : {}) });
}

export interface Sim {
  url: string;
  port: number;
  proc: Proc;
  stop(): Promise<void>;
}

/** A sim engine serving `model` on a free loopback port, fast by default. */
export async function startSim(model: string, flags: string[] = [], port?: number): Promise<Sim> {
  const p = port ?? (await freePort());
  const proc = startLlmgw(`sim-${model}-${p}`, [
    "sim-engine",
    "serve",
    model,
    "--host",
    "127.0.0.1",
    "--port",
    String(p),
    "--sim-speed",
    "200",
    ...flags,
  ]);
  await readyOrKilled(proc, /sim engine ready/, 30_000);
  return track({ url: `http://127.0.0.1:${p}`, port: p, proc, stop: () => proc.kill() });
}

/**
 * The sim engine's SGLang persona (`test/bin/sglang`, as the agent runs
 * SGLang), for what SGLang's wire does to the edge; `flags` are SGLang's and
 * the sim's. Ready when it listens (SGLang binds only once it can serve).
 */
export async function startSglangSim(model: string, flags: string[] = [], port?: number): Promise<Sim> {
  const p = port ?? (await freePort());
  const proc = startProcess(`sglang-${model}-${p}`, join(REPO, "test", "bin", "sglang"), [
    ...["-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1", "--port", String(p)],
    ...["--enable-metrics", "--sim-speed", "200", ...flags],
  ]);
  await readyOrKilled(proc, /sim engine listening/, 30_000);
  return track({ url: `http://127.0.0.1:${p}`, port: p, proc, stop: () => proc.kill() });
}

/**
 * A process not ready in time is stopped before the error goes up: nothing
 * tracks it yet, so it would outlive the test run (sim engines slow to start
 * on a loaded machine were found running 40 minutes later).
 */
async function readyOrKilled(proc: Proc, ready: RegExp, timeoutMs: number): Promise<void> {
  try {
    await proc.waitFor(ready, timeoutMs);
  } catch (err) {
    await proc.kill().catch(() => {});
    throw err;
  }
}

export interface EngineCounters {
  prompt: number;
  generation: number;
  /** Requests the engine finished, any reason (stop, length, abort). */
  finished: number;
  /** Requests running or waiting now: 0 once every cancelled one is reaped. */
  busy: number;
}

export async function engineCounters(sim: { url: string }): Promise<EngineCounters> {
  const text = await (await fetch(`${sim.url}/metrics`)).text();
  const sum = (name: string) => {
    let s = 0;
    for (const line of text.split("\n")) {
      if (line.startsWith(`${name}{`) || line.startsWith(`${name} `))
        s += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
    return s;
  };
  return {
    prompt: sum("vllm:prompt_tokens_total"),
    generation: sum("vllm:generation_tokens_total"),
    finished: sum("vllm:request_success_total"),
    busy: sum("vllm:num_requests_running") + sum("vllm:num_requests_waiting"),
  };
}

export interface TestKey {
  id: string;
  secret: string;
}

let keySeq = 0;

export async function createKey(
  edge: Pick<Edge, "sync">,
  opts: {
    band?: string;
    defaultBand?: string;
    models?: string[];
    rpm?: number;
    tpm?: number;
    maxConcurrent?: number;
    budget?: { tokens: number; period: string };
    /** When the key stops working (0 or none: never). */
    expiresAtUnixMs?: number;
  } = {},
): Promise<TestKey> {
  const secret = newSecret();
  const id = `key_test_${process.pid}_${++keySeq}`;
  await edge.sync.putKey({
    key: {
      id,
      hash: hashSecret(secret),
      name: id,
      maxBand: opts.band ?? "gold",
      defaultBand: opts.defaultBand ?? "",
      models: opts.models ?? [],
      rpm: opts.rpm ?? 0,
      tpm: opts.tpm ?? 0,
      maxConcurrent: opts.maxConcurrent ?? 0,
      budget: opts.budget ? { tokens: BigInt(opts.budget.tokens), period: opts.budget.period } : undefined,
      createdAtUnixMs: BigInt(Date.now()),
      expiresAtUnixMs: BigInt(opts.expiresAtUnixMs ?? 0),
    },
  });
  return { id, secret };
}

export interface EndpointSpec {
  id: string;
  url: string;
  models: string[];
  priority?: number;
  weight?: number;
  /** The spill group. Default: "default" at priority 0, else a group of its own per priority (a group's endpoints share one). */
  pool?: string;
  /** What the engine can hold, as an endpoint file's `capacity:` says it. */
  capacity?: { maxNumSeqs?: number; kvTokens?: number };
  /** The model name sent to this engine in place of the catalog's. */
  servedModelName?: string;
  /** The key the engine requires, which the edge sends it. */
  apiKey?: string | undefined;
}

export async function setEndpoints(edge: Pick<Edge, "sync">, endpoints: EndpointSpec[]): Promise<void> {
  await edge.sync.putEndpointSets({
    endpoints: endpoints.map((e) => ({
      id: e.id,
      url: e.url,
      models: e.models,
      pool: e.pool ?? (e.priority ? `priority-${e.priority}` : "default"),
      weight: e.weight ?? 1,
      priority: e.priority ?? 0,
      via: "direct",
      maxNumSeqs: e.capacity?.maxNumSeqs ?? 0,
      kvTokens: BigInt(e.capacity?.kvTokens ?? 0),
      servedModelName: e.servedModelName ?? "",
      apiKey: e.apiKey ?? "",
    })),
  });
}

export async function keyUsage(edge: Pick<Edge, "sync">, keyId: string) {
  const { usage } = await edge.sync.getUsage({ keyId });
  const u = usage[0]!;
  return {
    requests: Number(u.requests),
    prompt: Number(u.promptTokens),
    completion: Number(u.completionTokens),
    partial: Number(u.partialRequests),
    estimatedRequests: Number(u.estimatedRequests),
    estimatedTokens: Number(u.estimatedTokens),
  };
}

export function chatBody(model: string, extra: Record<string, unknown> = {}) {
  return { model, messages: [{ role: "user", content: "Say something." }], max_tokens: 8, ...extra };
}

/**
 * A client that hangs up mid-stream: a fresh TCP connection (no pooled
 * keep-alive socket that might outlive the abort), an HTTP/1.1 POST, read
 * until `events` SSE events have arrived, then destroy the socket.
 * Resolves with the number of events read and the raw head of the response.
 */
export async function streamThenHangUp(
  baseUrl: string,
  path: string,
  headers: Record<string, string>,
  body: unknown,
  events: number,
): Promise<{ events: number; head: string }> {
  const { connect } = await import("node:net");
  const u = new URL(baseUrl);
  const payload = Buffer.from(JSON.stringify(body));
  const lines = [
    `POST ${path} HTTP/1.1`,
    `host: ${u.host}`,
    "content-type: application/json",
    `content-length: ${payload.length}`,
    "connection: close",
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
  ];
  return new Promise((resolve, reject) => {
    const sock = connect(Number(u.port), u.hostname);
    let text = "";
    let seen = 0;
    sock.on(
      "connect",
      () =>
        sock.end === undefined ||
        sock.write(Buffer.concat([Buffer.from(`${lines.join("\r\n")}\r\n\r\n`), payload])),
    );
    sock.on("data", (d: Buffer) => {
      text += d.toString("utf8");
      seen = text.split("\n\n").length - 1;
      // The header block ends with \r\n\r\n, which is not an SSE event.
      if (text.includes("\r\n\r\n")) seen = text.slice(text.indexOf("\r\n\r\n") + 4).split("\n\n").length - 1;
      if (seen >= events) {
        sock.destroy();
        resolve({ events: seen, head: text.slice(0, text.indexOf("\r\n\r\n")) });
      }
    });
    sock.on("error", reject);
    sock.on("close", () => resolve({ events: seen, head: text.slice(0, text.indexOf("\r\n\r\n")) }));
  });
}

/**
 * Everything startEdge/startSim/startEdgeMiniflare started in this test
 * process, so afterAll can stop it all — including what did start when a
 * sibling in the same Promise.all failed (which would otherwise outlive the
 * test run as an orphan).
 */
const running = new Set<{ stop(): Promise<void> }>();

function track<T extends { stop(): Promise<void> }>(x: T): T {
  const stop = x.stop.bind(x);
  const tracked = Object.assign(x, {
    stop: async () => {
      running.delete(tracked);
      await stop();
    },
  });
  running.add(tracked);
  return tracked;
}

export async function stopStarted(): Promise<void> {
  await Promise.all([...running].map((x) => x.stop().catch(() => {})));
}

export interface EdgeIsolates {
  /** One direct URL per isolate. */
  urls: string[];
  token: string;
  sync: EdgeSyncClient;
  /** Any extra worker's direct URL, by name. */
  extra: Record<string, string>;
  stop(): Promise<void>;
}

/**
 * The edge as several isolates sharing one set of Durable Objects and one
 * KV namespace — what two Cloudflare locations share, and what one
 * `wrangler dev` cannot show: Miniflare runs `isolates` copies of the
 * bundled Worker, each with its own module state (caches, fail-open
 * pools), all bound to the first copy's KeyLedger, RevocationLog and
 * ModelPool. `pool` puts another script's class behind MODEL_POOL (a test
 * double for a pool that cannot be reached); that script is served too,
 * under its name, at `extra[name]`.
 */
export async function startEdgeIsolates(
  isolates: number,
  router: Record<string, unknown> = {},
  pool?: { name: string; config: string; entry: string; className: string },
): Promise<EdgeIsolates> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-edge-iso-"));
  const config = join(REPO, "wrangler.toml");
  const script = bundleWorker(config, join(dir, "edge"), "worker.js");
  const token = newSecret();
  const kvNamespaces = { LLMGW_KV: "llmgw-kv-shared" };
  const bindings = { EDGE_SYNC_TOKEN: token, LLMGW_ROUTER: JSON.stringify(router) };
  const sockets = await Promise.all(Array.from({ length: isolates + (pool ? 1 : 0) }, () => freePort()));
  const own = (className: string) => ({ className, useSQLite: true });
  const shared = (className: string) => ({ className, useSQLite: true, scriptName: "edge-0" });
  const runtime = runtimeOf(config);
  const workers: Record<string, unknown>[] = Array.from({ length: isolates }, (_, i) => ({
    ...runtime,
    name: `edge-${i}`,
    modules: true,
    scriptPath: script,
    modulesRoot: join(dir, "edge"),
    kvNamespaces,
    bindings,
    durableObjects: {
      KEY_LEDGER: i === 0 ? own("KeyLedger") : shared("KeyLedger"),
      REVOCATIONS: i === 0 ? own("RevocationLog") : shared("RevocationLog"),
      MODEL_POOL: pool
        ? { className: pool.className, useSQLite: true, scriptName: pool.name }
        : i === 0
          ? own("ModelPool")
          : shared("ModelPool"),
    },
    unsafeDirectSockets: [{ host: "127.0.0.1", port: sockets[i] }],
  }));
  if (pool) {
    const poolScript = bundleWorker(pool.config, join(dir, pool.name), pool.entry);
    workers.push({
      ...runtime,
      name: pool.name,
      modules: true,
      scriptPath: poolScript,
      modulesRoot: join(dir, pool.name),
      kvNamespaces,
      bindings,
      durableObjects: { POOL: own(pool.className) },
      unsafeDirectSockets: [{ host: "127.0.0.1", port: sockets[isolates] }],
    });
  }
  const onLog = withoutAccessLog();
  const mf = new Miniflare({
    host: "127.0.0.1",
    port: await freePort(),
    workers: workers as never,
    structuredWorkerdLogs: true,
    handleStructuredLogs: ({ level, message }: { level: string; message: string }) => onLog(level, message),
  });
  await mf.ready;
  const direct = async (name: string) => String(await mf.unsafeGetDirectURL(name)).replace(/\/$/, "");
  const urls = await Promise.all(Array.from({ length: isolates }, (_, i) => direct(`edge-${i}`)));
  return track({
    urls,
    token,
    sync: edgeSyncClient(urls[0]!, token),
    extra: pool ? { [pool.name]: await direct(pool.name) } : {},
    async stop() {
      await mf.dispose();
      rmSync(dir, { recursive: true, force: true });
    },
  });
}

export { bundleWorker, directSocket, runtimeOf, WRANGLER };
