/**
 * bench:edge — what the edge adds on the request path (auth, ledger
 * admission, pick, usage-sniffing proxy), measured in one run against the
 * same sim engine called directly and through a bare pass-through Worker
 * (bench/passthrough-worker.ts) in the same workerd setup.
 *
 * Every Worker runs in workerd through Miniflare, bundled exactly as
 * `wrangler deploy` would bundle it (`wrangler deploy --dry-run
 * --outdir`), and is called on a socket of its own (Miniflare's
 * unsafeDirectSockets), not through Miniflare's entry worker: that local-dev
 * shim runs JavaScript when each response starts, which Cloudflare's front
 * line does not, and a Worker that holds its response until the first token
 * (the edge with `stream_commit: first_token`) pays it inside TTFT while the
 * pass-through pays it before. Between two runs, one through it and one not, each Worker's CPU
 * fell by 0.9–1.5 ms per request and the edge's Δp50 TTFT at concurrency
 * 16 from +5.0 to +1.2 ms (docs/edge.md). Not
 * through `wrangler dev` either: its ProxyWorker (a second workerd relaying
 * over HTTP, plus per-request logging in Node) caps any Worker at ~65 req/s
 * on this machine and would hide what is measured.
 *
 * Streamed chat completions at a fixed concurrency; TTFT = request start to
 * the first SSE data event at the client. Targets are run in rotating
 * rounds so drift on a noisy machine hits all of them alike.
 * Targets: edge p50 TTFT within 2 ms of the pass-through (issue 22's goal:
 * within 1 ms at concurrency 1 and 16, printed beside it), and at least
 * 80 % of its requests per second.
 *
 * Four scenarios (engine speed × concurrency), one after the other in the
 * same run:
 * - credible, loaded: the sim's own latency model (sim-speed 1, a token
 *   every ~10 ms per stream), what a deployment sees, at concurrency 16;
 *   answers end at the sim's EOS, 8 to 24 tokens, so streams end in
 *   different engine steps, as real answers do;
 * - the same in lockstep: every answer exactly 16 tokens, so all 16 streams
 *   end in the same step and the next 16 requests reach the Worker
 *   together; the worst case for a Worker's one thread, and what an
 *   earlier version of this benchmark ran (its closed loop had every
 *   answer capped at the same max_tokens);
 * - stress: sim-speed 1000, a whole answer within a millisecond or two, so
 *   the machine is CPU-bound and req/s measures CPU per request — chiefly
 *   the relay's cost per SSE chunk, which the pass-through does not pay;
 * - credible, unloaded: concurrency 1, so nothing waits on workerd's one
 *   thread and the Δ is the latency the edge itself puts on a request.
 *
 * The sim engine traces every request (--sim-trace), so each TTFT splits
 * into the time before the engine had the request, the engine's own share
 * and the time after it wrote the first token. Only the outer two are the
 * Worker's; the engine's share moves with where an arrival falls in a batch
 * step, so "outside the engine" is the cleaner figure of what a Worker adds.
 *
 * Each target's p50 is also taken per round and set against the
 * pass-through's in the same round: the spread of those paired Δs says how
 * much of the pooled Δ is the host moving under the run.
 *
 * With two or more CPUs the Workers' workerd processes are pinned to the
 * last CPU and this process and the sim engine to the others (taskset), as
 * in production, where a Worker's CPU does not compete with the engine's or
 * the client's; unpinned, whatever CPU the edge uses slows the sim and the
 * client too and shows up in every row. PIN=0 turns this off.
 *
 * Also printed: CPU time of each Worker's workerd process per request
 * (from /proc), and how many of the engine's connections each target's
 * requests came on (the trace's connection numbers): a Worker that left
 * each answer half-read opened a new one per request.
 *
 * A second edge, its model pools POOL_RTT_MS (40) away (bench/far-pool-worker.ts:
 * every call to a pool waits half of it each way), runs beside the first: a
 * Worker far from its pool pays that distance before the first token, and
 * `[placement]` next to the pool is what takes it off (docs/deploy.md).
 * A third runs the same far pool answering every call "busy", so its
 * Workers' channels never pipeline admits (docs/routing.md, "A far pool"):
 * side by side, what pipelining takes off. POOL_RTT_MS=0 leaves both out.
 * A fourth commits streams at their first token (`stream_commit:
 * first_token`) rather than at the engine's headers, the default: what a
 * status of its own for a failure before the first token costs in TTFT
 * (docs/edge.md, "When a stream is committed"). HOLD=0 leaves it out.
 *
 * BESIDE runs more edges beside the others, `name=entry` pairs separated by
 * commas, each entry a Worker module bundled with this repo's wrangler.toml:
 * another checkout's edge/worker.ts measures a change against the design
 * before it in the same run, on the same machine minute by minute (docs/edge.md).
 *
 * Env: SCENARIOS ("1x16,1x16:lockstep,1000x16,1x1": sim-speed x concurrency,
 * optionally :lockstep), REQUESTS per target per round at concurrency 16
 * (150; scaled down with concurrency, at least 40), ROUNDS (6), OUTPUT_LEN
 * (16: the mean answer length; the exact one in lockstep), PIN (1), POOL_RTT_MS (40), HOLD (1),
 * BESIDE (none), API (chat; `responses` streams the Responses API instead, whose
 * first token is its first `response.output_text.delta`; not with lockstep),
 * ENGINE (vllm; `sglang` puts the sim engine's SGLang persona behind every
 * target, whose wire differs: a role chunk, the finish in a chunk of its
 * own, usage on every chunk once asked).
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join, resolve } from "node:path";
// Miniflare at the version wrangler brings (package.json pins it so): the same workerd build.
import { Miniflare } from "miniflare";
import { freePort } from "../common/free-ports.ts";
import { processCpuSeconds, REPO } from "../common/processes.ts";
import {
  bundleWorker,
  createKey,
  directSocket,
  type FastEdge,
  runtimeOf,
  setEndpoints,
  startEdgeMiniflare,
  startSglangSim,
  startSim,
} from "../scripts/edge-harness.ts";
import { processArgv } from "../scripts/fleet.ts";
import { readTrace, type TraceRecord } from "../sim-engine/request-trace.ts";
import { numberKnob } from "./knobs.ts";

const REQUESTS = numberKnob("REQUESTS", 150, 1);
const ROUNDS = numberKnob("ROUNDS", 6, 1);
const OUTPUT_LEN = numberKnob("OUTPUT_LEN", 16, 1);
const POOL_RTT_MS = numberKnob("POOL_RTT_MS", 40);
const HOLD = process.env.HOLD !== "0";
// A deployment's engines require a key the edge sends (docs/security.md,
// engine keys): so do the bench's, and every target sends it, unless 0.
const ENGINE_KEY = process.env.ENGINE_KEY === "0" ? "" : "llmgw-e-bench-0123456789abcdef";
const engineAuth: Record<string, string> = ENGINE_KEY ? { authorization: `Bearer ${ENGINE_KEY}` } : {};
const API = process.env.API ?? "chat";
const ENGINE = process.env.ENGINE ?? "vllm";
if (ENGINE !== "vllm" && ENGINE !== "sglang")
  throw new Error(`ENGINE: "${ENGINE}" is neither vllm nor sglang`);
if (API !== "chat" && API !== "responses") throw new Error(`API: "${API}" is neither chat nor responses`);
const EDGE = "llmgw edge";
const FAR = `${EDGE}, pool ${POOL_RTT_MS} ms away`;
const FAR_UNPIPELINED = `${FAR}, admits not pipelined`;
const HELD = `${EDGE}, committed at the first token`;

interface Scenario {
  speed: string;
  concurrency: number;
  lockstep: boolean;
}

function scenarios(spec: string): Scenario[] {
  return spec.split(",").map((part) => {
    const m = /^\s*(\d+(?:\.\d+)?)x([1-9]\d*)(:lockstep)?\s*$/.exec(part);
    if (!m) throw new Error(`SCENARIOS: "${part}" is not sim-speed x concurrency[:lockstep], e.g. 1x16`);
    return { speed: m[1]!, concurrency: Number(m[2]), lockstep: m[3] !== undefined };
  });
}

const SCENARIOS = scenarios(process.env.SCENARIOS ?? "1x16,1x16:lockstep,1000x16,1x1");

function besides(spec: string): { name: string; entry: string }[] {
  return spec
    .split(",")
    .filter((part) => part.trim() !== "")
    .map((part) => {
      const m = /^\s*([^=]*[^=\s])\s*=\s*(\S+)\s*$/.exec(part);
      if (!m) throw new Error(`BESIDE: "${part}" is not name=entry, e.g. before=../before/edge/worker.ts`);
      const entry = resolve(m[2]!);
      if (!existsSync(entry)) throw new Error(`BESIDE: ${m[1]}: no file ${entry}`);
      return { name: m[1]!, entry };
    });
}

const BESIDE = besides(process.env.BESIDE ?? "");

function describeScenario(sc: Scenario): string {
  return `sim-speed ${sc.speed}, concurrency ${sc.concurrency}${sc.lockstep ? ", lockstep" : ""}`;
}
const CPUS = availableParallelism();
const PIN = process.env.PIN !== "0" && CPUS >= 2 && spawnSync("taskset", ["--version"]).status === 0;
// The Workers get the last CPU; the load generator and the sim engine the rest.
const WORKER_CPUS = String(CPUS - 1);
const OTHER_CPUS = CPUS > 2 ? `0-${CPUS - 2}` : "0";

/** Pins a process and all its threads to a CPU list (a no-op unless PIN). */
function pin(pid: number | undefined, cpus: string): void {
  if (!PIN || pid === undefined) return;
  const r = spawnSync("taskset", ["-a", "-p", "-c", cpus, String(pid)], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`taskset ${cpus} ${pid} failed: ${r.stderr}`);
}

interface Target {
  name: string;
  url: string;
  /** The workerd process serving it, for CPU per request (undefined: not a Worker). */
  pid?: number | undefined;
  cpuMs: number;
  headers: Record<string, string>;
  ttft: number[];
  /** p50 TTFT of each round, for the paired per-round Δ. */
  roundP50: number[];
  /** Recorded requests by their `user` tag: wall-clock send and first-data times, for the engine's trace. */
  sent: Map<string, { sentMs: number; firstDataMs: number }>;
  ms: number;
  done: number;
  errors: number;
}

let requestSeq = 0;

/** One streamed request's path, body, and what marks its first token in the bytes. */
function request(i: number, lockstep: boolean, user: string) {
  const content = `Request ${i % 50}: tell me something.`;
  if (API === "responses") {
    if (lockstep)
      throw new Error("API=responses has no lockstep scenario (the sim's Responses API has no ignore_eos)");
    return {
      path: "/v1/responses",
      body: { model: "bench", input: content, max_output_tokens: 2 * OUTPUT_LEN, stream: true, user },
      // The events before it (response.created, …) come before any token.
      firstToken: "response.output_text.delta",
    };
  }
  return {
    path: "/v1/chat/completions",
    body: {
      model: "bench",
      messages: [{ role: "user", content }],
      // The natural length (EOS) is at most 1.5 × --sim-output-len, so the cap never binds.
      ...(lockstep ? { max_tokens: OUTPUT_LEN, ignore_eos: true } : { max_tokens: 2 * OUTPUT_LEN }),
      stream: true,
      user,
    },
    firstToken: "data: ",
  };
}

async function one(t: Target, i: number, lockstep: boolean): Promise<void> {
  const user = `bench-${++requestSeq}`;
  const { path, body, firstToken } = request(i, lockstep, user);
  const t0 = performance.now();
  const res = await fetch(`${t.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...t.headers },
    body: JSON.stringify(body),
  });
  if (res.status !== 200 || !res.body) {
    t.errors++;
    await res.text().catch(() => {});
    return;
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let first = true;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (first && dec.decode(value, { stream: true }).includes(firstToken)) {
      const t1 = performance.now();
      t.ttft.push(t1 - t0);
      t.sent.set(user, {
        sentMs: performance.timeOrigin + t0,
        firstDataMs: performance.timeOrigin + t1,
      });
      first = false;
    }
  }
  t.done++;
}

/** CPU time a process has used, in ms (0 for a target that is not a Worker). */
function cpuMs(pid: number | undefined): number {
  return pid === undefined ? 0 : processCpuSeconds(pid) * 1000;
}

/** The workerd process Miniflare started for the Worker listening on `port`. */
function workerdPid(port: number): number | undefined {
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    const argv = processArgv(Number(d));
    if (argv?.some((a) => a.includes("workerd")) && argv.some((a) => a.endsWith(`entry=127.0.0.1:${port}`))) {
      return Number(d);
    }
  }
  return undefined;
}

/** A target's measurements before anything has run. */
function noMeasurements(): Pick<Target, "cpuMs" | "ttft" | "roundP50" | "sent" | "ms" | "done" | "errors"> {
  return { cpuMs: 0, ttft: [], roundP50: [], sent: new Map(), ms: 0, done: 0, errors: 0 };
}

async function run(t: Target, n: number, sc: Scenario, record: boolean): Promise<void> {
  const scratch: Target = { ...t, ...noMeasurements() };
  const target = record ? t : scratch;
  const from = t.ttft.length;
  let next = 0;
  const cpu0 = cpuMs(t.pid);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: sc.concurrency }, async () => {
      while (next < n) await one(target, next++, sc.lockstep);
    }),
  );
  if (record) {
    t.ms += performance.now() - t0;
    t.cpuMs += cpuMs(t.pid) - cpu0;
    t.roundP50.push(pct(t.ttft.slice(from), 50));
  }
}

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
}

interface Verdict {
  scenario: Scenario;
  dP50: number;
  ratio: number;
  /** The edge's p50 time outside the engine (before it had the request, after its first token), Δ vs pass-through. */
  outsideP50: number;
  /** The same three figures for the minimal relay Worker. */
  floorP50: number;
  floorRatio: number;
  floorOutsideP50: number;
  /** The edge with its pool POOL_RTT_MS away, p50 TTFT Δ vs the edge with its pool near. */
  farP50: number | undefined;
  /** The same with the far pool saying it is busy: admits never pipelined. */
  farUnpipelinedP50: number | undefined;
  /** The edge committing streams at their first token, p50 TTFT Δ vs the edge as configured by default. */
  heldP50: number | undefined;
}

interface BenchWorker {
  name: string;
  config: string;
  script: string;
}

/** A target's TTFTs split by the engine's trace: before it had each request, after its first token, and the two together. */
interface Split {
  toEngine: number[];
  fromEngine: number[];
  outside: number[];
  /** The engine's connections its requests came on (a Worker that keeps them alive uses few). */
  connections: Set<number>;
}

function split(t: Target, trace: Map<string, TraceRecord>): Split {
  const out: Split = { toEngine: [], fromEngine: [], outside: [], connections: new Set() };
  for (const [user, c] of t.sent) {
    const r = trace.get(user);
    if (!r || r.first_token_ms === null) continue;
    const to = r.arrived_ms - c.sentMs;
    const from = c.firstDataMs - r.first_token_ms;
    out.toEngine.push(to);
    out.fromEngine.push(from);
    out.outside.push(to + from);
    out.connections.add(r.connection);
  }
  return out;
}

/** One scenario: a fresh sim engine and bench Workers, the edge re-pointed at the engine. */
async function measure(
  scenario: Scenario,
  edges: { name: string; edge: FastEdge; key: string }[],
  workers: BenchWorker[],
  dir: string,
): Promise<Verdict> {
  const { speed, concurrency } = scenario;
  const perRound = Math.max(40, Math.round((REQUESTS * concurrency) / 16));
  const warmup = Math.max(50, Math.round((200 * concurrency) / 16));
  const traceFile = join(dir, `trace-${speed}x${concurrency}${scenario.lockstep ? "-lockstep" : ""}.jsonl`);
  const sim = await scenarioSim(speed, traceFile);
  const ports = await Promise.all(workers.map(() => freePort()));
  const directs = await Promise.all(workers.map(() => directSocket()));
  const mfs = workers.map(
    (w, i) =>
      new Miniflare({
        ...runtimeOf(w.config),
        host: "127.0.0.1",
        modules: true,
        scriptPath: w.script,
        modulesRoot: dir,
        port: ports[i]!,
        bindings: { UPSTREAM: sim.url, ...(ENGINE_KEY ? { UPSTREAM_KEY: ENGINE_KEY } : {}) },
        ...directs[i]!.options,
      }),
  );
  const label = describeScenario(scenario);
  const mk = (name: string, url: string, headers: Record<string, string> = {}, pid?: number): Target => ({
    name,
    url,
    headers,
    pid,
    ...noMeasurements(),
  });
  let targets: Target[];
  try {
    const urls = await Promise.all(
      mfs.map(async (mf, i) => {
        await mf.ready;
        return directs[i]!.url(mf);
      }),
    );
    const endpoint = { id: "bench-1", url: sim.url, models: ["bench"], apiKey: ENGINE_KEY || undefined };
    for (const e of edges) await setEndpoints(e.edge, [endpoint]);
    targets = [
      mk("engine direct", sim.url, engineAuth),
      ...workers.map((w, i) => mk(w.name, urls[i]!, {}, workerdPid(ports[i]!))),
      ...edges.map((e) =>
        mk(e.name, e.edge.url, { authorization: `Bearer ${e.key}` }, workerdPid(e.edge.port)),
      ),
    ];
    for (const t of targets) if (t.pid !== undefined) pin(t.pid, WORKER_CPUS);
    process.stderr.write(`${label}: warming up...\n`);
    for (const t of targets) await run(t, warmup, scenario, false);
    for (let r = 0; r < ROUNDS; r++) {
      for (let k = 0; k < targets.length; k++) {
        const t = targets[(k + r) % targets.length]!;
        process.stderr.write(`${label}, round ${r + 1}/${ROUNDS}: ${t.name}\n`);
        await run(t, perRound, scenario, true);
      }
    }
  } finally {
    // Stopping the sim flushes its trace.
    await Promise.all([...mfs.map((mf) => mf.dispose()), sim.stop()]);
  }
  const trace = readTrace(traceFile);
  const splits = new Map(targets.map((t) => [t, split(t, trace)]));
  printTable(scenario, label, perRound, targets, splits);
  return verdictOf(scenario, targets, splits);
}

/** The scenario's sim engine, on the CPUs the Workers do not use, tracing every request to `traceFile`. */
async function scenarioSim(speed: string, traceFile: string) {
  // Lockstep answers ignore EOS; the others end at one drawn from [L/2, 3L/2].
  const simFlags = ["--sim-speed", speed, "--sim-output-len", String(OUTPUT_LEN), "--sim-trace", traceFile];
  if (ENGINE_KEY) simFlags.push("--api-key", ENGINE_KEY);
  const sim =
    ENGINE === "sglang"
      ? await startSglangSim("bench", ["--max-running-requests", "512", ...simFlags])
      : await startSim("bench", ["--max-num-seqs", "512", ...simFlags]);
  pin(sim.proc.child.pid, OTHER_CPUS);
  return sim;
}

/** The scenario's table: each target against the pass-through (targets[1]). */
function printTable(
  scenario: Scenario,
  label: string,
  perRound: number,
  targets: Target[],
  splits: Map<Target, Split>,
): void {
  const pt = targets[1]!;
  const ptP50 = pct(pt.ttft, 50);
  const ptOutside = pct(splits.get(pt)!.outside, 50);
  const ptRps = (pt.done / pt.ms) * 1000;
  // Round r of every target ran within seconds of the pass-through's round r.
  const paired = (t: Target) => t.roundP50.map((p, r) => p - pt.roundP50[r]!).sort((a, b) => a - b);
  const signed = (x: number, digits = 1) => `${x >= 0 ? "+" : ""}${x.toFixed(digits)}`;
  const rows = targets.map((t) => {
    const rps = (t.done / t.ms) * 1000;
    const d = paired(t);
    const sp = splits.get(t)!;
    return [
      t.name,
      pct(t.ttft, 50).toFixed(2),
      pct(t.ttft, 99).toFixed(2),
      rps.toFixed(0),
      (pct(t.ttft, 50) - ptP50).toFixed(2),
      t === pt ? "-" : `${signed(d[0]!)} … ${signed(d.at(-1)!)}`,
      `${pct(sp.toEngine, 50).toFixed(2)} / ${pct(sp.fromEngine, 50).toFixed(2)}`,
      (pct(sp.outside, 50) - ptOutside).toFixed(2),
      `${((rps / ptRps) * 100).toFixed(0)} %`,
      t.pid === undefined ? "-" : (t.cpuMs / t.done).toFixed(2),
      `${sp.connections.size} / ${sp.outside.length}`,
      `${t.errors}${sp.outside.length < t.ttft.length ? ` (${t.ttft.length - sp.outside.length} untraced)` : ""}`,
    ];
  });
  const header = [
    "target",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "req/s",
    "Δp50 vs pass-through ms",
    "per-round Δp50 ms",
    "to / from engine p50 ms",
    "outside engine Δp50 ms",
    "req/s vs pass-through",
    "workerd CPU ms/req",
    "engine connections / requests",
    "errors",
  ];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => `| ${cells.map((c, i) => c.padEnd(widths[i]!)).join(" | ")} |`;
  const lengths = scenario.lockstep
    ? `every answer ${OUTPUT_LEN} tokens`
    : `answers ${Math.ceil(OUTPUT_LEN / 2)}–${Math.floor((3 * OUTPUT_LEN) / 2)} tokens`;
  process.stdout.write(
    `\n${label} — streamed chat, ${lengths}, ${ROUNDS}×${perRound} requests per target\n\n`,
  );
  process.stdout.write(
    `${[line(header), line(widths.map((w) => "-".repeat(w))), ...rows.map(line)].join("\n")}\n`,
  );
}

/** What the scenario says of the edge: its cost over the pass-through, and the floor's and the far pool's. */
function verdictOf(scenario: Scenario, targets: Target[], splits: Map<Target, Split>): Verdict {
  const pt = targets[1]!;
  const ptP50 = pct(pt.ttft, 50);
  const ptOutside = pct(splits.get(pt)!.outside, 50);
  const ptRps = (pt.done / pt.ms) * 1000;
  const e = targets.find((t) => t.name === EDGE)!;
  const far = targets.find((t) => t.name === FAR);
  const unpipelined = targets.find((t) => t.name === FAR_UNPIPELINED);
  const held = targets.find((t) => t.name === HELD);
  const floor = targets[2]!;
  return {
    scenario,
    dP50: pct(e.ttft, 50) - ptP50,
    ratio: ((e.done / e.ms) * 1000) / ptRps,
    outsideP50: pct(splits.get(e)!.outside, 50) - ptOutside,
    floorP50: pct(floor.ttft, 50) - ptP50,
    floorRatio: ((floor.done / floor.ms) * 1000) / ptRps,
    floorOutsideP50: pct(splits.get(floor)!.outside, 50) - ptOutside,
    farP50: far ? pct(far.ttft, 50) - pct(e.ttft, 50) : undefined,
    farUnpipelinedP50: unpipelined ? pct(unpipelined.ttft, 50) - pct(e.ttft, 50) : undefined,
    heldP50: held ? pct(held.ttft, 50) - pct(e.ttft, 50) : undefined,
  };
}

async function main(): Promise<void> {
  process.stderr.write("bundling, starting the edge...\n");
  pin(process.pid, OTHER_CPUS);
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-edge-"));
  // The pass-through first: it is what the rows' Δ and % are relative to.
  const workers: BenchWorker[] = [
    ["bare pass-through Worker", "passthrough"],
    ["minimal JS relay Worker", "relay"],
  ].map(([name, base]) => {
    const config = join(REPO, "bench", `${base}.wrangler.toml`);
    return { name: name!, config, script: bundleWorker(config, dir, `${base}-worker.js`) };
  });
  const edges: { name: string; edge: FastEdge; key: string }[] = [];
  try {
    const edge = await startEdgeMiniflare();
    edges.push({ name: EDGE, edge, key: (await createKey(edge)).secret });
    if (HOLD) {
      const held = await startEdgeMiniflare({ stream_commit: "first_token" });
      edges.push({ name: HELD, edge: held, key: (await createKey(held)).secret });
    }
    for (const b of BESIDE) {
      const beside = await startEdgeMiniflare({}, {}, b.entry);
      edges.push({ name: b.name, edge: beside, key: (await createKey(beside)).secret });
    }
    if (POOL_RTT_MS > 0) {
      const far = await startEdgeMiniflare(
        {},
        { BENCH_POOL_RTT_MS: String(POOL_RTT_MS) },
        join(REPO, "bench", "far-pool-worker.ts"),
      );
      edges.push({ name: FAR, edge: far, key: (await createKey(far)).secret });
      const unpipelined = await startEdgeMiniflare(
        {},
        { BENCH_POOL_RTT_MS: String(POOL_RTT_MS), BENCH_POOL_SAYS_BUSY: "1" },
        join(REPO, "bench", "far-pool-worker.ts"),
      );
      edges.push({ name: FAR_UNPIPELINED, edge: unpipelined, key: (await createKey(unpipelined)).secret });
    }
    process.stdout.write(
      `bench:edge — ${PIN ? `Workers pinned to CPU ${WORKER_CPUS}, load generator and sim engine to CPU ${OTHER_CPUS}` : "unpinned"} (${CPUS} CPUs)\n`,
    );
    const verdicts: Verdict[] = [];
    for (const sc of SCENARIOS) verdicts.push(await measure(sc, edges, workers, dir));
    process.stdout.write(
      "\ntargets (p50 TTFT within 2 ms of the pass-through, and issue 22's goal of 1 ms; ≥ 80 % of its req/s):\n",
    );
    const signed = (x: number) => `${x >= 0 ? "+" : ""}${x.toFixed(2)}`;
    for (const v of verdicts) {
      process.stdout.write(
        `  ${describeScenario(v.scenario)}: TTFT ${v.dP50 <= 2 ? "met" : "MISSED"}, 1 ms goal ${v.dP50 <= 1 ? "met" : "MISSED"} (${signed(v.dP50)} ms; outside the engine ${signed(v.outsideP50)} ms); ` +
          `req/s ${v.ratio >= 0.8 ? "met" : "MISSED"} (${(v.ratio * 100).toFixed(0)} %); ` +
          `the minimal JS relay alone: ${signed(v.floorP50)} ms (outside ${signed(v.floorOutsideP50)} ms), ${(v.floorRatio * 100).toFixed(0)} %` +
          `${v.farP50 === undefined ? "" : `; the pool ${POOL_RTT_MS} ms away adds ${signed(v.farP50)} ms p50 (what placement next to it saves)`}` +
          `${v.farUnpipelinedP50 === undefined ? "" : `, ${signed(v.farUnpipelinedP50)} ms with admits not pipelined`}` +
          `${v.heldP50 === undefined ? "" : `; committing streams at the first token (stream_commit: first_token) adds ${signed(v.heldP50)} ms p50`}\n`,
      );
    }
  } finally {
    await Promise.all(edges.map((e) => e.edge.stop()));
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`bench:edge failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exitCode = 1;
});
