/**
 * What SGLang says about itself (python/sglang/srt/entrypoints/http_server.py):
 *
 * - `/server_info` (and `/get_server_info`, its deprecated name): the server
 *   args as a dict, snake_case, at the top level (`dataclasses.asdict(
 *   server_args)`: resolved defaults shown, flags not given null), then the
 *   scheduler's start-up info (`status`, `max_total_num_tokens`,
 *   `max_req_input_len`), `internal_states` (one per data-parallel rank: its
 *   args again, `memory_usage` in GB and `effective_max_running_requests_per_dp`,
 *   the scheduler's batch; managers/scheduler.py, get_internal_state) and
 *   `version`. The args include `api_key` in clear, as SGLang's do: whoever
 *   can read this endpoint (it needs the key itself) reads the key.
 * - `/model_info` (and `/get_model_info`): the model's path and kind.
 * - `/v1/models`: one card, the served name, owned by "sglang".
 *
 * The args listed are those a consumer is likely to read (SGLang has some
 * three hundred); a name SGLang has but the sim leaves out is simply absent.
 */
import type { SglangFlags } from "./sglang-flags.ts";
import type { SglangSizing } from "./sglang-sizing.ts";

/** What a deployed SGLang reports as its version; the sim's own, so a reader can tell. */
export const SGLANG_SIM_VERSION = "0.0.0+llmgw-sim";

/** The Llama-3-shaped model the sim engine stands for (latency-model.ts). */
const MODEL_TYPE = "llama";
const ARCHITECTURES = ["LlamaForCausalLM"];

/** server_args.py's dataclass fields, in its order, as `dataclasses.asdict` gives them. */
export function serverArgs(f: SglangFlags, s: SglangSizing): Record<string, unknown> {
  return {
    model_path: f.modelPath,
    tokenizer_path: f.tokenizerPath,
    tokenizer_mode: "auto",
    skip_tokenizer_init: false,
    load_format: "auto",
    trust_remote_code: f.trustRemoteCode,
    context_length: f.contextLength ?? null,
    is_embedding: false,
    host: f.host,
    port: f.port,
    dtype: "auto",
    kv_cache_dtype: "auto",
    mem_fraction_static: s.memFractionStatic,
    max_running_requests: f.maxRunningRequests ?? null,
    max_total_tokens: f.maxTotalTokens ?? null,
    chunked_prefill_size: s.chunkedPrefillSize,
    max_prefill_tokens: f.maxPrefillTokens,
    schedule_policy: "fcfs",
    schedule_conservativeness: 1.0,
    page_size: f.pageSize,
    device: "cuda",
    tp_size: f.tpSize,
    pp_size: f.ppSize,
    stream_interval: 1,
    random_seed: f.randomSeed ?? 0,
    log_level: f.logLevel,
    enable_metrics: f.enableMetrics,
    enable_metrics_for_all_schedulers: f.enableMetricsForAllSchedulers,
    decode_log_interval: 40,
    api_key: f.apiKey ?? null,
    served_model_name: f.servedModelName,
    weight_version: "default",
    enable_cache_report: f.enableCacheReport,
    tool_call_parser: f.toolCallParser ?? null,
    stream_response_default_include_usage: f.streamResponseDefaultIncludeUsage,
    dp_size: f.dpSize,
    load_balance_method: "round_robin",
    dist_init_addr: f.distInitAddr ?? null,
    nnodes: f.nnodes,
    node_rank: f.nodeRank,
    disable_radix_cache: f.disableRadixCache,
    enable_dp_attention: f.enableDpAttention,
  };
}

export interface RankState {
  /** The scheduler's last decode throughput (recent-stats.ts). */
  lastGenThroughput: number;
}

export function serverInfo(f: SglangFlags, s: SglangSizing, ranks: readonly RankState[]): unknown {
  const args = serverArgs(f, s);
  return {
    ...args,
    status: "ready",
    max_total_num_tokens: s.maxTotalNumTokens,
    max_req_input_len: s.maxReqInputLen,
    internal_states: ranks.map((r) => ({
      ...args,
      use_mla_backend: false,
      last_gen_throughput: r.lastGenThroughput,
      // The sim captures no CUDA graphs.
      memory_usage: {
        weight: s.weightGiB,
        kvcache: s.kvCacheGiB,
        token_capacity: s.maxTotalNumTokens,
        graph: 0,
      },
      effective_max_running_requests_per_dp: s.maxRunningRequests,
    })),
    version: SGLANG_SIM_VERSION,
  };
}

export function modelInfo(f: SglangFlags): unknown {
  return {
    model_path: f.modelPath,
    tokenizer_path: f.tokenizerPath,
    is_generation: true,
    preferred_sampling_params: null,
    weight_version: "default",
    has_image_understanding: false,
    has_audio_understanding: false,
    model_type: MODEL_TYPE,
    architectures: ARCHITECTURES,
  };
}

/** protocol.py's ModelCard: SGLang lists its one served name, as its own root. */
export function modelCard(name: string, contextLength: number, created: number): unknown {
  return {
    id: name,
    object: "model",
    created,
    owned_by: "sglang",
    root: name,
    parent: null,
    max_model_len: contextLength,
  };
}
