/**
 * SGLang's Prometheus exposition (python/sglang/srt/metrics/collector.py),
 * for the sim engine's SGLang persona. Two sources, as in SGLang:
 *
 * - the scheduler's gauges, one series per data-parallel rank, labelled
 *   `model_name`, `engine_type="unified"`, `tp_rank`, `pp_rank` and, when
 *   there are several DP ranks, `dp_rank` (managers/scheduler.py,
 *   init_metrics); only TP rank 0 reports unless
 *   --enable-metrics-for-all-schedulers, when every TP rank repeats it.
 * - the tokenizer manager's counters and histograms, labelled `model_name`
 *   only, which move when a request *finishes* (collector.py,
 *   observe_one_finished_request): a request's prompt and generated tokens
 *   are added at its end, not token by token as vLLM's are, and a request
 *   the client abandoned adds none (SGLang drops its state on abort). Like
 *   prometheus_client's labelled metrics, a family has no sample until its
 *   first observation.
 *
 * Counters are exposed as prometheus_client writes them: the family named
 * without `_total`, the sample with it. Latencies are simulated seconds.
 */
import type { RequestObserver } from "./generation.ts";
import { type EngineGauges, esc, Histogram, num } from "./metrics.ts";
import type { RecentStats } from "./recent-stats.ts";

/** collector.py's default buckets (TokenizerMetricsCollector). */
export const SGLANG_TTFT_BUCKETS = [
  0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
];
export const SGLANG_E2E_BUCKETS = [
  0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
];
export const SGLANG_ITL_BUCKETS = [
  0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6,
  0.8, 1, 2, 4, 6, 8,
];

/** The tokenizer manager's request-level figures, fed by every generation's choices (generation.ts). */
export class SglangRequestMetrics implements RequestObserver {
  promptTokens = 0;
  generationTokens = 0;
  cachedTokens = 0;
  requests = 0;
  abortedRequests = 0;
  readonly ttft = new Histogram(SGLANG_TTFT_BUCKETS);
  readonly itl = new Histogram(SGLANG_ITL_BUCKETS);
  readonly e2e = new Histogram(SGLANG_E2E_BUCKETS);

  firstToken(seconds: number): void {
    this.ttft.observe(Math.max(0, seconds));
  }

  interToken(seconds: number): void {
    this.itl.observe(Math.max(0, seconds));
  }

  finished(prompt: number, completion: number, cached: number, e2eSeconds: number): void {
    this.promptTokens += prompt;
    this.generationTokens += completion;
    this.cachedTokens += cached;
    this.requests++;
    this.e2e.observe(Math.max(0, e2eSeconds));
  }

  aborted(): void {
    this.abortedRequests++;
  }
}

/** One scheduler (DP rank): its live gauges and recent figures. */
export interface SglangScheduler {
  gauges: EngineGauges;
  recent: RecentStats;
}

export interface SglangMetricsContext {
  modelName: string;
  /** KV pool tokens per DP rank (sglang:max_total_num_tokens). */
  maxTotalNumTokens: number;
  tpSize: number;
  allSchedulers: boolean;
  simLagSeconds: number;
}

type Gauge = [name: string, help: string, value: (s: SglangScheduler, c: SglangMetricsContext) => number];

/** collector.py's SchedulerMetricsCollector gauges the sim has figures for, in its order. */
const GAUGES: Gauge[] = [
  ["sglang:num_running_reqs", "The number of running requests.", (s) => s.gauges.running],
  [
    "sglang:num_used_tokens",
    "The number of used tokens.",
    (s) => Math.round(s.gauges.kvUsage * s.gauges.numBlocks) * s.gauges.blockSize,
  ],
  ["sglang:token_usage", "The token usage.", (s) => s.gauges.kvUsage],
  ["sglang:gen_throughput", "The generation throughput (token/s).", (s) => s.recent.genThroughput],
  ["sglang:num_queue_reqs", "The number of requests in the waiting queue.", (s) => s.gauges.waiting],
  ["sglang:cache_hit_rate", "The prefix cache hit rate.", (s) => s.recent.lastPrefillHitRate],
  [
    "sglang:max_total_num_tokens",
    "Maximum total number of tokens in the KV cache pool.",
    (_s, c) => c.maxTotalNumTokens,
  ],
];

function schedulerGauges(
  out: string[],
  schedulers: readonly SglangScheduler[],
  c: SglangMetricsContext,
): void {
  const model = esc(c.modelName);
  const tpRanks = c.allSchedulers ? c.tpSize : 1;
  for (const [name, help, value] of GAUGES) {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
    schedulers.forEach((s, dp) => {
      const dpLabel = schedulers.length > 1 ? `,dp_rank="${dp}"` : "";
      for (let tp = 0; tp < tpRanks; tp++) {
        out.push(
          `${name}{model_name="${model}",engine_type="unified",tp_rank="${tp}",pp_rank="0"${dpLabel}} ${num(value(s, c))}`,
        );
      }
    });
  }
}

function tokenizerFamilies(out: string[], m: SglangRequestMetrics, modelName: string): void {
  const label = `model_name="${esc(modelName)}"`;
  const counter = (name: string, help: string, v: number, seen: boolean) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`);
    if (seen) out.push(`${name}_total{${label}} ${num(v)}`);
  };
  const finished = m.requests > 0;
  counter("sglang:prompt_tokens", "Number of prefill tokens processed.", m.promptTokens, finished);
  counter("sglang:generation_tokens", "Number of generation tokens processed.", m.generationTokens, finished);
  counter("sglang:cached_tokens", "Number of cached prompt tokens.", m.cachedTokens, m.cachedTokens > 0);
  counter("sglang:num_requests", "Number of requests processed.", m.requests, finished);
  counter(
    "sglang:num_aborted_requests",
    "Number of requests aborted.",
    m.abortedRequests,
    m.abortedRequests > 0,
  );
  const hist = (name: string, help: string, h: Histogram) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
    if (h.count === 0) return;
    let acc = 0;
    h.buckets.forEach((b, k) => {
      acc += h.counts[k]!;
      out.push(`${name}_bucket{le="${num(b)}",${label}} ${num(acc)}`);
    });
    out.push(`${name}_bucket{le="+Inf",${label}} ${num(h.count)}`);
    out.push(`${name}_count{${label}} ${num(h.count)}`, `${name}_sum{${label}} ${num(h.sum)}`);
  };
  hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft);
  hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m.itl);
  hist("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", m.e2e);
}

export function renderSglangMetrics(
  schedulers: readonly SglangScheduler[],
  requests: SglangRequestMetrics,
  c: SglangMetricsContext,
): string {
  const out: string[] = [];
  schedulerGauges(out, schedulers, c);
  tokenizerFamilies(out, requests, c.modelName);
  out.push(
    "# HELP llmgw_sim_lag_seconds_total Simulated seconds the sim engine fell behind --sim-speed.",
    "# TYPE llmgw_sim_lag_seconds_total counter",
    `llmgw_sim_lag_seconds_total ${num(c.simLagSeconds)}`,
  );
  return `${out.join("\n")}\n`;
}
