/**
 * The latency model against published vLLM measurements of Llama-3(.1)-8B
 * on one H100: each point as data (source, setup, the figure it published,
 * vLLM's era, and the workload and engine limits the model runs for it) and
 * the model's figure for it, computed by predict.ts on a virtual clock.
 * `npm run bench:sim-engine` prints the table, docs/sim-engine.md keeps a
 * copy, and calibration.test.ts holds every V1-era point to ±20 %.
 *
 * Where a source used a dataset, the model runs synthetic lengths: lognormal,
 * clipped, with the dataset's published mean. Each prompt starts with a token
 * of its own, so no request hits another's prefix cache (ShareGPT and
 * CNN-DailyMail share nothing but the BOS token). Pure and deterministic.
 */

import { mulberry32 } from "../common/rng.ts";
import type { EngineCoreConfig } from "./engine-core.ts";
import {
  H100_80GB_LLAMA_3_1_8B_MEMORY,
  H100_LLAMA_3_1_8B,
  kvBlocksFor,
  type LatencyParams,
} from "./latency-model.ts";
import { type RequestRecord, replayTrace, simulateClosedLoop, type TraceRequest } from "./predict.ts";

/**
 * "V1": vLLM's V1 engine (0.7 with VLLM_USE_V1=1, the default from 0.8),
 * which runs the scheduler and the API server beside the GPU loop. "V0": the
 * engine before it. "unknown": the source does not say.
 */
export type Era = "V1" | "V0" | "unknown";

export const METRICS = {
  "tpot-p50": { label: "TPOT p50", unit: "ms", scale: 1000 },
  "tpot-mean": { label: "TPOT mean", unit: "ms", scale: 1000 },
  "e2e-mean": { label: "mean latency", unit: "s", scale: 1 },
  "requests/s": { label: "throughput", unit: "req/s", scale: 1 },
  "output tok/s": { label: "output throughput", unit: "tok/s", scale: 1 },
} as const;
export type Metric = keyof typeof METRICS;

/** Token counts: `mean` exactly when `sigma` is 0, else lognormal clipped to [min, max] with that mean. */
export interface Lengths {
  mean: number;
  sigma: number;
  min: number;
  max: number;
}

export type Arrival =
  | { kind: "closed-loop"; concurrency: number; requestsPerClient: number }
  /** vLLM's `benchmark_serving --request-rate QPS`: exponential gaps, the first request at 0. */
  | { kind: "poisson"; qps: number; requests: number }
  /** Every request at t = 0: `--request-rate inf`, or an offline batch. */
  | { kind: "burst"; requests: number };

export interface EngineSetup {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  gpuMemoryUtilization: number;
  weights: "bf16" | "fp8";
}

export interface PublishedPoint {
  id: string;
  source: string;
  url: string;
  /** What the source says it ran. */
  setup: string;
  era: Era;
  metric: Metric;
  /** The source's figure, in the metric's unit (METRICS[metric].unit). */
  published: number;
  /** What the model runs for it (describeWorkload prints it). */
  arrival: Arrival;
  input: Lengths;
  output: Lengths;
  /** The source's vLLM defaults on an H100 unless it says otherwise. */
  engine: EngineSetup;
}

const fixed = (n: number): Lengths => ({ mean: n, sigma: 0, min: n, max: n });
/**
 * ShareGPT V3 through vLLM's benchmark with the Llama-3 tokenizer: 1,000
 * prompts give 215,196 input tokens and ≈ 185–199k output tokens (the
 * dataset's answer lengths are the max_tokens), after its filter (4..1,024
 * prompt tokens). σ = 1: the lengths spread over two orders of magnitude.
 */
const SHAREGPT_IN: Lengths = { mean: 215, sigma: 1, min: 4, max: 1024 };
const SHAREGPT_OUT: Lengths = { mean: 198, sigma: 1, min: 4, max: 1024 };

/** `vllm serve` in vLLM ≥ 0.9 on a GPU of ≥ 70 GB other than an A100. */
const V1_SERVE: EngineSetup = {
  maxNumSeqs: 1024,
  maxNumBatchedTokens: 8192,
  gpuMemoryUtilization: 0.9,
  weights: "bf16",
};
/** The offline `LLM` class in the same versions. */
const V1_OFFLINE: EngineSetup = { ...V1_SERVE, maxNumBatchedTokens: 16_384 };
/** `vllm serve` in the V1 alpha (0.7.0 with VLLM_USE_V1=1). */
const V1_ALPHA: EngineSetup = { ...V1_SERVE, maxNumBatchedTokens: 2048 };
/**
 * vLLM 0.5–0.6 (V0): 256 sequences; without chunked prefill a step holds up
 * to max_model_len (8,192) tokens. V0 scheduled prefills before decodes; the
 * model schedules like V1 for every point.
 */
const V0: EngineSetup = {
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  gpuMemoryUtilization: 0.9,
  weights: "bf16",
};

const INFERENCEBENCH = {
  source: "InferenceBench concurrency-sweep recipe",
  url: "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/",
};
const V06_BLOG = {
  source: "vLLM v0.6.0 performance blog",
  url: "https://blog.vllm.ai/2024/09/05/perf-update.html",
};
const V1_ALPHA_BLOG = {
  source: "vLLM V1 alpha blog",
  url: "https://blog.vllm.ai/2025/01/27/v1-alpha-release.html",
};

/** Chart values (#2–#6) were read by eye, ± 5–10 %. */
export const PUBLISHED_POINTS: readonly PublishedPoint[] = [
  ...[
    { id: "1a", c: 1, tpot: 6.48 },
    { id: "1b", c: 4, tpot: 6.59 },
  ].map(
    ({ id, c, tpot }): PublishedPoint => ({
      id,
      ...INFERENCEBENCH,
      setup: `vLLM 0.21.0, fp16, chatbot-short, closed loop c=${c}`,
      era: "V1",
      metric: "tpot-p50",
      published: tpot,
      arrival: { kind: "closed-loop", concurrency: c, requestsPerClient: 20 },
      // Ten one-line questions (~40 tokens with the chat template); answer lengths are not published,
      // and a decode step's time barely depends on them.
      input: fixed(40),
      output: { mean: 250, sigma: 0.5, min: 16, max: 1024 },
      engine: V1_SERVE,
    }),
  ),
  ...[
    { id: "2a", qps: 2, tpot: 8 },
    { id: "2b", qps: 32, tpot: 13.5 },
  ].map(
    ({ id, qps, tpot }): PublishedPoint => ({
      id,
      ...V06_BLOG,
      setup: `Llama-3-8B BF16, ShareGPT (500 prompts), Poisson ${qps} QPS`,
      era: "V0",
      metric: "tpot-mean",
      published: tpot,
      arrival: { kind: "poisson", qps, requests: 500 },
      input: SHAREGPT_IN,
      output: SHAREGPT_OUT,
      engine: V0,
    }),
  ),
  ...[
    { id: "3", setup: "ShareGPT (500 prompts), QPS ∞", rps: 36.5, input: SHAREGPT_IN, output: SHAREGPT_OUT },
    { id: "4", setup: "462 in / 256 out, QPS ∞", rps: 31, input: fixed(462), output: fixed(256) },
    {
      id: "5",
      setup: "462 in / 16 out (prefill-heavy), QPS ∞",
      rps: 59,
      input: fixed(462),
      output: fixed(16),
    },
  ].map(
    ({ id, setup, rps, input, output }): PublishedPoint => ({
      id,
      ...V06_BLOG,
      setup,
      era: "V0",
      metric: "requests/s",
      published: rps,
      arrival: { kind: "burst", requests: 500 },
      input,
      output,
      engine: V0,
    }),
  ),
  ...[
    { id: "6a", qps: 1, seconds: 1.7 },
    { id: "6b", qps: 20, seconds: 2.0 },
    { id: "6c", qps: 40, seconds: 2.8 },
    { id: "6d", qps: 50, seconds: 3.9 },
  ].map(
    ({ id, qps, seconds }): PublishedPoint => ({
      id,
      ...V1_ALPHA_BLOG,
      setup: `Llama-3.1-8B, ShareGPT, Poisson ${qps} QPS`,
      era: "V1",
      metric: "e2e-mean",
      published: seconds,
      // The prompt count is not published: vLLM's benchmark default.
      arrival: { kind: "poisson", qps, requests: 1000 },
      input: SHAREGPT_IN,
      output: SHAREGPT_OUT,
      engine: V1_ALPHA,
    }),
  ),
  {
    id: "7",
    source: "vllm PR #7117 (V0, ≈ 0.5.4)",
    url: "https://github.com/vllm-project/vllm/pull/7117",
    setup: "offline, 1,000 × 256 in / 256 out",
    era: "V0",
    metric: "requests/s",
    published: 24.3,
    arrival: { kind: "burst", requests: 1000 },
    input: fixed(256),
    output: fixed(256),
    engine: V0,
  },
  {
    id: "8",
    source: "AIMultiple inference-engine comparison",
    url: "https://research.aimultiple.com/inference-engines",
    setup: "BF16, vLLM + FlashInfer, GPU memory 0.8, offline, 1,000 ShareGPT prompts (version unstated)",
    era: "unknown",
    metric: "output tok/s",
    published: 12_553,
    // Run with today's offline defaults, the version being unknown.
    arrival: { kind: "burst", requests: 1000 },
    input: SHAREGPT_IN,
    output: SHAREGPT_OUT,
    engine: { ...V1_OFFLINE, gpuMemoryUtilization: 0.8 },
  },
  {
    id: "9",
    source: "MLPerf Inference v5.1, Red Hat's submission",
    url: "https://www.redhat.com/en/blog/efficient-and-reproducible-llm-inference-red-hat-mlperf-inference-v51-results",
    setup: "vLLM 0.10.0, FP8, CNN-DailyMail, Offline (model: FP8 parameters, below)",
    era: "V1",
    metric: "output tok/s",
    published: 5777,
    // Articles of ≈ 778 tokens, summaries of ≈ 73 (at most 128, MLPerf's max_new_tokens); 1,000 of the
    // 13,368 samples are enough for a steady rate.
    arrival: { kind: "burst", requests: 1000 },
    input: { mean: 778, sigma: 0.4, min: 64, max: 2048 },
    output: { mean: 73, sigma: 0.4, min: 8, max: 128 },
    engine: { ...V1_OFFLINE, weights: "fp8" },
  },
];

/** How far the model may be from a published figure and still count as matching it. */
export const TOLERANCE = 0.2;

/**
 * The same GPU with FP8 weights (W8A8, as MLPerf submissions run): half the
 * bytes to stream per step, and the H100's FP8 tensor cores do twice the
 * BF16 FLOP/s. The KV cache stays BF16 (the submission's KV precision is not
 * known to us), and the fixed and per-sequence costs are not about weights.
 */
export function fp8Weights(p: LatencyParams): LatencyParams {
  return { ...p, weightsReadMs: p.weightsReadMs * 0.5, computeUsPerToken: p.computeUsPerToken * 0.5 };
}

function engineFor(setup: EngineSetup, params: LatencyParams): EngineCoreConfig {
  const fp8 = setup.weights === "fp8";
  const m = H100_80GB_LLAMA_3_1_8B_MEMORY;
  // FP8 weights take half the memory, which leaves the KV cache the rest.
  const memory = fp8 ? { ...m, weightsGB: m.weightsGB / 2 } : m;
  return {
    maxNumSeqs: setup.maxNumSeqs,
    maxNumBatchedTokens: setup.maxNumBatchedTokens,
    numBlocks: kvBlocksFor(memory, setup.gpuMemoryUtilization, 1, 16),
    blockSize: 16,
    prefixCaching: true,
    latency: fp8 ? fp8Weights(params) : params,
  };
}

/** Box–Muller: one standard normal from two uniforms. */
function gaussian(rand: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
}

/** `n` lengths drawn from `l`; the lognormal's location is bisected until the clipped, rounded draws have `l.mean`. */
export function drawLengths(l: Lengths, n: number, rand: () => number): number[] {
  if (l.sigma === 0) return new Array<number>(n).fill(l.mean);
  const z = Array.from({ length: n }, () => gaussian(rand));
  const draw = (mu: number) =>
    z.map((v) => Math.min(l.max, Math.max(l.min, Math.round(Math.exp(mu + l.sigma * v)))));
  let lo = Math.log(l.min);
  let hi = Math.log(l.max);
  for (let i = 0; i < 50; i++) {
    const mid = (lo + hi) / 2;
    if (mean(draw(mid)) < l.mean) lo = mid;
    else hi = mid;
  }
  return draw(hi);
}

const mean = (xs: readonly number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

interface Run {
  perRequest: RequestRecord[];
  outputTokens: number;
  seconds: number;
}

function simulate(point: PublishedPoint, params: LatencyParams, seed: number): Run {
  const rand = mulberry32(seed);
  const cfg = engineFor(point.engine, params);
  const a = point.arrival;
  const n = a.kind === "closed-loop" ? a.concurrency * a.requestsPerClient : a.requests;
  const inputs = drawLengths(point.input, n, rand);
  const outputs = drawLengths(point.output, n, rand);
  // A first token of its own makes every block hash of a prompt its own (the hashes are chained).
  const prompts = inputs.map((len, i) => {
    const ids = new Array<number>(len).fill(0);
    ids[0] = i + 1;
    return ids;
  });
  if (a.kind === "closed-loop") {
    const at = (client: number, round: number) => client * a.requestsPerClient + round;
    return simulateClosedLoop(cfg, {
      concurrency: a.concurrency,
      requestsPerClient: a.requestsPerClient,
      prompt: (c, r) => prompts[at(c, r)]!,
      outputTokens: (c, r) => outputs[at(c, r)]!,
    });
  }
  let t = 0;
  const trace: TraceRequest[] = prompts.map((prompt, i) => {
    if (a.kind === "poisson" && i > 0) t += -Math.log(1 - rand()) / a.qps;
    return { at: t, prompt, outputTokens: outputs[i]! };
  });
  return replayTrace(cfg, trace);
}

/** In seconds or per second. TPOT is vLLM's: (end − first token) / (output tokens − 1), per request. */
function measure(metric: Metric, run: Run): number {
  const tpots = run.perRequest
    .filter((r) => r.outputTokens > 1)
    .map((r) => (r.end - r.firstToken) / (r.outputTokens - 1));
  switch (metric) {
    case "tpot-p50":
      return median(tpots);
    case "tpot-mean":
      return mean(tpots);
    case "e2e-mean":
      return mean(run.perRequest.map((r) => r.end - r.arrival));
    case "requests/s":
      return run.perRequest.length / run.seconds;
    case "output tok/s":
      return run.outputTokens / run.seconds;
  }
}

/**
 * How many random workloads a model figure is the mean of. Near saturation
 * one draw of 1,000 Poisson arrivals moves the mean latency by up to ± 7 %.
 */
export const RUNS = 5;

const isRandom = (p: PublishedPoint) =>
  p.arrival.kind === "poisson" || p.input.sigma > 0 || p.output.sigma > 0;

/**
 * The model's figure for `point`, in the metric's unit: the mean over the
 * workloads drawn from seeds 1..runs (one run where nothing is random).
 */
export function modelFigure(
  point: PublishedPoint,
  params: LatencyParams = H100_LLAMA_3_1_8B,
  runs = RUNS,
): number {
  const n = isRandom(point) ? runs : 1;
  let sum = 0;
  for (let seed = 1; seed <= n; seed++) sum += measure(point.metric, simulate(point, params, seed));
  return (sum / n) * METRICS[point.metric].scale;
}

export interface CalibrationRow {
  point: PublishedPoint;
  model: number;
  /** model ÷ published: for a latency, < 1 means the model is too fast; for a throughput, too slow. */
  ratio: number;
  within: boolean;
}

export function calibrate(params: LatencyParams = H100_LLAMA_3_1_8B, runs = RUNS): CalibrationRow[] {
  return PUBLISHED_POINTS.map((point) => {
    const model = modelFigure(point, params, runs);
    const ratio = model / point.published;
    return { point, model, ratio, within: Math.abs(ratio - 1) <= TOLERANCE };
  });
}

const count = (n: number) => n.toLocaleString("en-US");
const lengths = (l: Lengths) => (l.sigma === 0 ? count(l.mean) : `${count(l.mean)} (lognormal σ ${l.sigma})`);

/** What the model runs for `point`, in one line. */
export function describeWorkload(p: PublishedPoint): string {
  const a = p.arrival;
  const load =
    a.kind === "closed-loop"
      ? `closed loop, ${a.concurrency} × ${a.requestsPerClient} requests`
      : a.kind === "poisson"
        ? `${count(a.requests)} requests, Poisson ${a.qps}/s`
        : `${count(a.requests)} requests at t = 0`;
  const e = p.engine;
  return (
    `${load}; in ${lengths(p.input)} / out ${lengths(p.output)} tokens; ` +
    `${count(e.maxNumSeqs)} seqs, ${count(e.maxNumBatchedTokens)} tokens a step, memory ${e.gpuMemoryUtilization}` +
    (e.weights === "fp8" ? "; FP8 weights (fp8Weights)" : "")
  );
}
