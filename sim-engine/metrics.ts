/**
 * The sim engine's Prometheus exposition, with vLLM V1's metric names,
 * labels (`model_name`, `engine`) and histogram buckets, so the agent's
 * scraper and any vLLM dashboard read it unchanged. Pure: the caller passes
 * gauges in at render time.
 */

export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
  80.0, 160.0, 640.0, 2560.0,
];
export const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
export const E2E_BUCKETS = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
  960.0, 1920.0, 7680.0,
];

export class Histogram {
  readonly buckets: readonly number[];
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(buckets: readonly number[]) {
    this.buckets = buckets;
    this.counts = new Array(buckets.length).fill(0);
  }

  observe(v: number): void {
    this.sum += v;
    this.count++;
    // Non-cumulative per bucket; rendering accumulates.
    for (let i = 0; i < this.buckets.length; i++) {
      if (v <= this.buckets[i]!) {
        this.counts[i]!++;
        return;
      }
    }
  }

  mean(): number {
    return this.count === 0 ? 0 : this.sum / this.count;
  }
}

/** Everything one engine core counts. Counters only go up. */
export class EngineMetrics {
  promptTokens = 0;
  generationTokens = 0;
  prefixQueries = 0;
  prefixHits = 0;
  preemptions = 0;
  readonly success: Record<"stop" | "length" | "abort", number> = { stop: 0, length: 0, abort: 0 };
  readonly ttft = new Histogram(TTFT_BUCKETS);
  readonly itl = new Histogram(ITL_BUCKETS);
  readonly e2e = new Histogram(E2E_BUCKETS);
}

export interface EngineGauges {
  waiting: number;
  running: number;
  kvUsage: number;
  numBlocks: number;
  blockSize: number;
}

export interface ProcessGauges {
  cpuSeconds: number;
  residentBytes: number;
  startTimeSeconds: number;
  /** Simulated seconds the engine could not keep up with --sim-speed. */
  simLagSeconds: number;
}

/** A label value escaped as the exposition format wants it. */
export function esc(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/** prometheus_client's float rendering, which vLLM and SGLang both use: 24.0, 0.73, +Inf. */
export function num(v: number): string {
  if (v === Number.POSITIVE_INFINITY) return "+Inf";
  return Number.isInteger(v) ? `${v}.0` : String(v);
}

type EngineFigures = { metrics: EngineMetrics; gauges: EngineGauges };
/** One figure per engine: name, type, help (vLLM's words), and where it is read. */
type Scalar = [string, "gauge" | "counter", string, (e: EngineFigures) => number];

const GAUGES: Scalar[] = [
  [
    "vllm:num_requests_running",
    "gauge",
    "Number of requests in model execution batches.",
    (e) => e.gauges.running,
  ],
  [
    "vllm:num_requests_waiting",
    "gauge",
    "Number of requests waiting to be processed.",
    (e) => e.gauges.waiting,
  ],
  [
    "vllm:kv_cache_usage_perc",
    "gauge",
    "KV-cache usage. 1 means 100 percent usage.",
    (e) => e.gauges.kvUsage,
  ],
];

const COUNTERS: Scalar[] = [
  [
    "vllm:prefix_cache_queries_total",
    "counter",
    "Prefix cache queries, in terms of number of queried tokens.",
    (e) => e.metrics.prefixQueries,
  ],
  [
    "vllm:prefix_cache_hits_total",
    "counter",
    "Prefix cache hits, in terms of number of cached tokens.",
    (e) => e.metrics.prefixHits,
  ],
  [
    "vllm:num_preemptions_total",
    "counter",
    "Cumulative number of preemption from the engine.",
    (e) => e.metrics.preemptions,
  ],
  [
    "vllm:prompt_tokens_total",
    "counter",
    "Number of prefill tokens processed.",
    (e) => e.metrics.promptTokens,
  ],
  [
    "vllm:generation_tokens_total",
    "counter",
    "Number of generation tokens processed.",
    (e) => e.metrics.generationTokens,
  ],
];

export function renderMetrics(modelName: string, engines: EngineFigures[], proc: ProcessGauges): string {
  const out: string[] = [];
  const labels = (i: number, extra = "") => `{engine="${i}",model_name="${esc(modelName)}"${extra}}`;
  const family = (name: string, type: string, help: string, values: (i: number) => string[]) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    engines.forEach((_, i) => {
      out.push(...values(i));
    });
  };
  const scalar = (name: string, type: string, help: string, get: (i: number) => number) =>
    family(name, type, help, (i) => [`${name}${labels(i)} ${num(get(i))}`]);
  const hist = (name: string, help: string, get: (i: number) => Histogram) =>
    family(name, "histogram", help, (i) => {
      const h = get(i);
      const lines: string[] = [];
      let acc = 0;
      h.buckets.forEach((b, k) => {
        acc += h.counts[k]!;
        lines.push(`${name}_bucket${labels(i, `,le="${num(b)}"`)} ${num(acc)}`);
      });
      lines.push(`${name}_bucket${labels(i, `,le="+Inf"`)} ${num(h.count)}`);
      lines.push(`${name}_count${labels(i)} ${num(h.count)}`, `${name}_sum${labels(i)} ${num(h.sum)}`);
      return lines;
    });
  const m = (i: number) => engines[i]!.metrics;
  const g = (i: number) => engines[i]!.gauges;

  for (const [name, type, help, get] of GAUGES) scalar(name, type, help, (i) => get(engines[i]!));
  family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", (i) => [
    `vllm:cache_config_info${labels(i, `,block_size="${g(i).blockSize}",num_gpu_blocks="${g(i).numBlocks}"`)} 1.0`,
  ]);
  for (const [name, type, help, get] of COUNTERS) scalar(name, type, help, (i) => get(engines[i]!));
  family("vllm:request_success_total", "counter", "Count of successfully processed requests.", (i) =>
    (["stop", "length", "abort"] as const).map(
      (r) => `vllm:request_success_total${labels(i, `,finished_reason="${r}"`)} ${num(m(i).success[r])}`,
    ),
  );
  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", (i) => m(i).ttft);
  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", (i) => m(i).itl);
  hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", (i) => m(i).e2e);

  out.push(
    "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
    "# TYPE process_cpu_seconds_total counter",
    `process_cpu_seconds_total ${num(proc.cpuSeconds)}`,
    "# HELP process_resident_memory_bytes Resident memory size in bytes.",
    "# TYPE process_resident_memory_bytes gauge",
    `process_resident_memory_bytes ${num(proc.residentBytes)}`,
    "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
    "# TYPE process_start_time_seconds gauge",
    `process_start_time_seconds ${num(proc.startTimeSeconds)}`,
    "# HELP llmgw_sim_lag_seconds_total Simulated seconds the sim engine fell behind --sim-speed.",
    "# TYPE llmgw_sim_lag_seconds_total counter",
    `llmgw_sim_lag_seconds_total ${num(proc.simLagSeconds)}`,
  );
  return `${out.join("\n")}\n`;
}
