/**
 * `npm run bench:sim-engine`: is the model true to published vLLM figures,
 * is the sim engine the model it claims to be, and is it cheap enough that a
 * fleet benchmark measures the model rather than the simulator?
 *
 * 0. Calibration. Every published point in sim-engine/calibration.ts
 *    beside the model's figure for the same workload (virtual clock, a few
 *    seconds). The bar: every V1-era point within ±20 %.
 * 1. Fidelity. A real engine process (default flags: Llama-3.1-8B on one
 *    H100) is driven by 1, 8 and 64 closed-loop streams of 1,000 prompt +
 *    128 output tokens (token-id prompts, so the model sees exactly the same
 *    ids). The client measures output tok/s, TTFT and ITL; the table puts
 *    them beside the engine's own /metrics and beside the model's prediction
 *    (the same EngineCore on a virtual clock, sim-engine/predict.ts).
 *    All times are simulated (real × --sim-speed).
 * 2. Cost. At --sim-speed 100 with 64 streams the engine is CPU-bound; we
 *    divide streamed output tokens by the engine's CPU seconds
 *    (/proc/<pid>/stat, cross-checked with process_cpu_seconds_total).
 *    The bar is 2,000 streamed tokens per CPU second.
 *
 * Env: SIM_BENCH_SPEED (fidelity speed, default 1), SIM_BENCH_COST_SECONDS (6).
 */
import { Agent, request } from "node:http";
import { freePort } from "../common/free-ports.ts";
import { type Proc, processCpuSeconds, startLlmgw, waitUntil } from "../common/processes.ts";
import {
  type CalibrationRow,
  calibrate,
  describeWorkload,
  METRICS,
  RUNS,
  TOLERANCE,
} from "../sim-engine/calibration.ts";
import { DEFAULT_H100_8B_CORE } from "../sim-engine/engine-core.ts";
import { replayTrace, simulateClosedLoop, type TraceRequest } from "../sim-engine/predict.ts";
import { BOS } from "../sim-engine/text.ts";
import { numberKnob } from "./knobs.ts";

const SPEED = numberKnob("SIM_BENCH_SPEED", 1);
const COST_SECONDS = numberKnob("SIM_BENCH_COST_SECONDS", 6);
const PROMPT = 1000;
const OUTPUT = 128;
const STAGGER_REAL_MS = 5;
const LEVELS = [
  { c: 1, rounds: 5 },
  { c: 8, rounds: 3 },
  { c: 64, rounds: 2 },
];

interface Engine {
  proc: Proc;
  port: number;
  agent: Agent;
}

async function start(flags: string[]): Promise<Engine> {
  const port = await freePort();
  const proc = startLlmgw("sim-engine", [
    "sim-engine",
    "serve",
    "bench-model",
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    ...flags,
  ]);
  await waitUntil(
    "engine healthy",
    async () => (await fetch(`http://127.0.0.1:${port}/health`)).status === 200,
    30_000,
    50,
  );
  return { proc, port, agent: new Agent({ keepAlive: true, maxSockets: 256 }) };
}

async function metrics(e: Engine): Promise<Map<string, number>> {
  const text = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || line === "") continue;
    const name = line.slice(0, line.search(/[{ ]/));
    out.set(name, (out.get(name) ?? 0) + Number(line.slice(line.lastIndexOf(" ") + 1)));
  }
  return out;
}

const promptIds = (client: number, round: number) =>
  Array.from({ length: PROMPT }, (_, i) => (client * 7919 + round * 104_729 + i * 31) % 120_000);

interface Sample {
  /** Request sent → first token. */
  ttftRaw: number;
  /** Response headers (sent when the engine accepts the request) → first token: what the engine's TTFT is. */
  ttft: number;
  /** performance.now() when the response headers arrived. */
  headersAt: number;
  /** The engine's own arrival stamp (x-llmgw-sim-arrival), simulated seconds. */
  simArrival: number;
  itlSum: number;
  itlCount: number;
  tokens: number;
}

/** One streamed completion; counts SSE token chunks without parsing JSON (the client must be cheaper than the engine). */
function stream(e: Engine, prompt: number[], maxTokens: number): Promise<Sample> {
  const body = JSON.stringify({
    model: "bench-model",
    prompt,
    max_tokens: maxTokens,
    ignore_eos: true,
    stream: true,
  });
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    let headers = 0;
    let simArrival = 0;
    let first = 0;
    let last = 0;
    let tokens = 0;
    const req = request(
      {
        host: "127.0.0.1",
        port: e.port,
        path: "/v1/completions",
        method: "POST",
        agent: e.agent,
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        if (res.statusCode !== 200) return reject(new Error(`status ${res.statusCode}`));
        headers = performance.now();
        simArrival = Number(res.headers["x-llmgw-sim-arrival"]);
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => {
          const now = performance.now();
          let n = 0;
          for (let at = chunk.indexOf('"text":'); at >= 0; at = chunk.indexOf('"text":', at + 7)) n++;
          if (n === 0) return;
          if (tokens === 0) first = now;
          tokens += n;
          last = now;
        });
        res.on("end", () =>
          resolve({
            ttftRaw: first - t0,
            ttft: first - headers,
            headersAt: headers,
            simArrival,
            itlSum: tokens > 1 ? last - first : 0,
            itlCount: Math.max(0, tokens - 1),
            tokens,
          }),
        );
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function fidelity(e: Engine) {
  const rows: string[][] = [];
  let worst = 0;
  // The first requests of a fresh process pay for JIT compilation; keep them out of the figures.
  for (let i = 0; i < 20; i++) await stream(e, promptIds(9000 + i, 0).slice(0, 100), 16);
  for (const [level, { c, rounds }] of LEVELS.entries()) {
    const run = await runLevel(e, level, c, rounds);
    const compared = compareLevel(c, rounds, run);
    rows.push(...compared.rows);
    worst = Math.max(worst, compared.worst);
  }
  return { rows, worst };
}

interface LevelRun {
  /** What the clients measured, in simulated seconds. */
  measured: { tps: number; ttft: number; ttftRaw: number; itl: number };
  /** What the engine's own histograms say over the level. */
  engine: { ttft: number; itl: number };
  /** Every request as the engine saw it arrive, for the replay. */
  trace: TraceRequest[];
}

/** One level of the closed loop: `c` staggered clients, `rounds` requests each, against the real process. */
async function runLevel(e: Engine, level: number, c: number, rounds: number): Promise<LevelRun> {
  const m0 = await metrics(e);
  const samples: Sample[] = [];
  const trace: TraceRequest[] = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: c }, async (_, client) => {
      await sleep(client * STAGGER_REAL_MS);
      for (let r = 0; r < rounds; r++) {
        // Fresh prompts per level: a prefix cached by an earlier level would flatter the engine.
        const prompt = promptIds(level * 1000 + client, r);
        const sample = await stream(e, prompt, OUTPUT);
        samples.push(sample);
        // The engine's own arrival stamp: client-side clocks lag under load and would blur the replay.
        trace.push({
          at: sample.simArrival,
          prompt: [BOS, ...prompt],
          outputTokens: OUTPUT,
        });
      }
    }),
  );
  const wallSim = ((performance.now() - t0) / 1000) * SPEED;
  const m1 = await metrics(e);
  const d = (k: string) => (m1.get(k) ?? 0) - (m0.get(k) ?? 0);
  const tokens = samples.reduce((s, x) => s + x.tokens, 0);
  return {
    measured: {
      tps: tokens / wallSim,
      ttft: (samples.reduce((s, x) => s + x.ttft, 0) / samples.length / 1000) * SPEED,
      ttftRaw: (samples.reduce((s, x) => s + x.ttftRaw, 0) / samples.length / 1000) * SPEED,
      itl:
        (samples.reduce((s, x) => s + x.itlSum, 0) / samples.reduce((s, x) => s + x.itlCount, 0) / 1000) *
        SPEED,
    },
    engine: {
      ttft: d("vllm:time_to_first_token_seconds_sum") / d("vllm:time_to_first_token_seconds_count"),
      itl: d("vllm:inter_token_latency_seconds_sum") / d("vllm:inter_token_latency_seconds_count"),
    },
    trace,
  };
}

/** A level's measured figures against the model's replay of its trace and its ideal closed loop: table rows and the worst miss. */
function compareLevel(c: number, rounds: number, { measured, engine, trace }: LevelRun) {
  const rows: string[][] = [];
  let worst = 0;
  // Same workload on a virtual clock: same ids (BOS prepended like the server), same stagger, the
  // client's turnaround (~0.5 ms real) as the gap, so a returning client misses the step in flight.
  const staggerSim = (STAGGER_REAL_MS / 1000) * SPEED;
  const cfg = DEFAULT_H100_8B_CORE;
  const replay = replayTrace(cfg, trace);
  const ideal = simulateClosedLoop(cfg, {
    concurrency: c,
    requestsPerClient: rounds,
    outputTokens: OUTPUT,
    prompt: (cl, r) => [BOS, ...promptIds(cl, r)],
    gapSeconds: 0.0005 * SPEED,
    startAt: (cl) => cl * staggerSim,
  });
  const line = (
    name: string,
    meas: number,
    eng: number | undefined,
    pred: number,
    idealPred: number,
    unit: string,
    scale = 1,
  ) => {
    const delta = (meas - pred) / pred;
    worst = Math.max(worst, Math.abs(delta));
    const f = (v: number) => `${(v * scale).toFixed(1)} ${unit}`;
    rows.push([
      String(c),
      name,
      f(meas),
      eng === undefined ? "" : f(eng),
      f(pred),
      f(idealPred),
      `${delta >= 0 ? "+" : ""}${(delta * 100).toFixed(1)} %`,
      Math.abs(delta) <= 0.1 ? "ok" : "OFF",
    ]);
  };
  line(
    "output throughput",
    measured.tps,
    undefined,
    replay.outputTokens / replay.seconds,
    ideal.outputTokensPerSecond,
    "tok/s",
  );
  line("TTFT mean", measured.ttft, engine.ttft, replay.ttftMean, ideal.ttftMean, "ms", 1000);
  rows.push([
    String(c),
    "  TTFT incl. upload",
    `${(measured.ttftRaw * 1000).toFixed(1)} ms`,
    "",
    "",
    "",
    "",
    "",
  ]);
  line("ITL mean", measured.itl, engine.itl, replay.itlMean, ideal.itlMean, "ms", 1000);
  return { rows, worst };
}

async function cost() {
  const e = await start(["--sim-speed", "100", "--seed", "1"]);
  const pid = e.proc.child.pid!;
  const m0 = await metrics(e);
  const cpu0 = processCpuSeconds(pid);
  const t0 = performance.now();
  const deadline = t0 + COST_SECONDS * 1000;
  let streamed = 0;
  await Promise.all(
    Array.from({ length: 64 }, async (_, client) => {
      for (let r = 0; performance.now() < deadline; r++) {
        const got = await stream(e, promptIds(client, r).slice(0, 256), 512);
        streamed += got.tokens;
      }
    }),
  );
  const wall = (performance.now() - t0) / 1000;
  const cpu = processCpuSeconds(pid) - cpu0;
  const m1 = await metrics(e);
  const generated =
    (m1.get("vllm:generation_tokens_total") ?? 0) - (m0.get("vllm:generation_tokens_total") ?? 0);
  const cpuReported = (m1.get("process_cpu_seconds_total") ?? 0) - (m0.get("process_cpu_seconds_total") ?? 0);
  const lag = (m1.get("llmgw_sim_lag_seconds_total") ?? 0) - (m0.get("llmgw_sim_lag_seconds_total") ?? 0);
  await e.proc.kill();
  return { wall, cpu, cpuReported, streamed, generated, lag };
}

function calibration(): { rows: string[][]; workloads: string[]; v1: CalibrationRow[] } {
  const results = calibrate();
  const published = (v: number) => v.toLocaleString("en-US", { maximumFractionDigits: 2 });
  const model = (v: number) => (v >= 100 ? Math.round(v).toLocaleString("en-US") : v.toPrecision(3));
  return {
    rows: results.map(({ point: p, model: m, ratio, within }) => {
      const { label, unit } = METRICS[p.metric];
      return [
        p.id,
        p.source,
        p.setup,
        `${label} ${published(p.published)} ${unit}`,
        `${model(m)} ${unit}`,
        ratio.toFixed(2),
        p.era,
        within ? "yes" : "no",
      ];
    }),
    workloads: results.map(({ point: p }) => `  #${p.id}: ${describeWorkload(p)}`),
    v1: results.filter((r) => r.point.era === "V1"),
  };
}

function table(head: string[], rows: string[][]): string {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const fmt = (r: string[]) => `| ${r.map((c, i) => c.padEnd(w[i]!)).join(" | ")} |`;
  return [fmt(head), `|${w.map((n) => "-".repeat(n + 2)).join("|")}|`, ...rows.map(fmt)].join("\n");
}

let exitCode = 0;
const tolerance = `±${TOLERANCE * 100} %`;
console.log(
  "calibration: the latency model's defaults against published vLLM figures, Llama-3(.1)-8B on one H100\n" +
    `(model: predict.ts on a virtual clock, the mean of ${RUNS} draws where the workload is random;\n` +
    " ratio = model ÷ published: < 1 is a model too fast for a latency, too slow for a throughput)\n",
);
const cal = calibration();
console.log(
  table(["#", "source", "setup", "published", "model", "ratio", "era", `within ${tolerance}`], cal.rows),
);
console.log(`\nwhat the model runs for each point:\n${cal.workloads.join("\n")}`);
const v1In = cal.v1.filter((r) => r.within).length;
console.log(`\nV1-era points within ${tolerance}: ${v1In} of ${cal.v1.length}\n`);
if (v1In < cal.v1.length) exitCode = 1;

const main = await start(["--sim-speed", String(SPEED), "--seed", "1"]);
try {
  console.log(
    `sim engine fidelity: Llama-3.1-8B / 1×H100 model, ${PROMPT} prompt + ${OUTPUT} output tokens, closed loop, --sim-speed ${SPEED}`,
  );
  console.log(
    "(times are simulated = real × speed. model (replay): the pure model fed the arrival times the clients really had;\n" +
      " model (ideal loop): perfectly synchronous clients. Δ compares what the client measured with the replay.\n" +
      " Client TTFT counts from the response headers, which the engine sends when it accepts the request;\n" +
      " 'TTFT incl. upload' adds sending and parsing the request, which no engine model includes.)\n",
  );
  const f = await fidelity(main);
  console.log(
    table(
      [
        "streams",
        "metric",
        "measured (client)",
        "engine /metrics",
        "model (replay)",
        "model (ideal loop)",
        "Δ vs model",
        "≤10 %",
      ],
      f.rows,
    ),
  );
  console.log(`\nworst deviation from the model: ${(f.worst * 100).toFixed(1)} %`);
  await main.proc.kill();

  console.log(
    `\nsimulator cost: --sim-speed 100, 64 streams of 256 prompt + 512 output tokens, ${COST_SECONDS} s`,
  );
  const c = await cost();
  const perCore = c.streamed / c.cpu;
  console.log(
    table(
      [
        "streamed tokens",
        "generation_tokens_total",
        "wall",
        "engine CPU (/proc)",
        "engine CPU (metrics)",
        "tokens/s wall",
        "tokens per CPU-second",
        "sim lag",
      ],
      [
        [
          String(c.streamed),
          String(c.generated),
          `${c.wall.toFixed(1)} s`,
          `${c.cpu.toFixed(2)} s`,
          `${c.cpuReported.toFixed(2)} s`,
          c.streamed / c.wall > 0 ? (c.streamed / c.wall).toFixed(0) : "0",
          perCore.toFixed(0),
          `${c.lag.toFixed(1)} sim-s`,
        ],
      ],
    ),
  );
  console.log(
    `\ncost bar (≥ 2,000 streamed tokens per engine CPU-second): ${perCore >= 2000 ? "met" : "NOT MET"}`,
  );
  if (perCore < 2000) exitCode = 1;
} catch (err) {
  // Say whether the engine died under us (and why) rather than only the client's socket error.
  console.error(`bench failed: ${err instanceof Error ? err.message : String(err)}`);
  console.error(`engine exit code: ${main.proc.child.exitCode}, signal: ${main.proc.child.signalCode}`);
  console.error(main.proc.output().slice(-3000));
  exitCode = 1;
} finally {
  await main.proc.kill();
}
process.exit(exitCode);
