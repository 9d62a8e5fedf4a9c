/**
 * What an engine's KV cache holds, as its own `/metrics` says. vLLM (and the
 * sim engine) export the cache's configuration as an info metric whose
 * labels carry `num_gpu_blocks` and `block_size`; SGLang exports the pool's
 * size in tokens as a gauge it sets once at start. The agent reads it off
 * the engines it launched, the control plane off static endpoints. The batch
 * is among neither engine's metrics: it comes from the engine's arguments,
 * SGLang's server info (common/sglang-server-info.ts) or the operator.
 */
import type { Sample } from "./prometheus-text.ts";

export const VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info";
export const SGLANG_MAX_TOTAL_NUM_TOKENS = "sglang:max_total_num_tokens";

/** Where in an engine's metrics its KV tokens are. */
export type KvCapacitySource =
  /** An info metric: `num_gpu_blocks` × `block_size` of each series (one per data-parallel engine), summed. */
  | { kind: "cache-config-info"; name: string }
  /**
   * A gauge of tokens per scheduler: every tensor- and pipeline-parallel
   * rank of one data-parallel rank reports the same pool, so the ranks of
   * one `dp_rank` count once and the data-parallel ranks add up.
   */
  | { kind: "token-gauge"; name: string };

export const VLLM_KV_CAPACITY: KvCapacitySource = { kind: "cache-config-info", name: VLLM_CACHE_CONFIG_INFO };
export const SGLANG_KV_CAPACITY: KvCapacitySource = {
  kind: "token-gauge",
  name: SGLANG_MAX_TOTAL_NUM_TOKENS,
};

/** Every metric name a KV source may be read from: what a scrape must keep. */
export const KV_CAPACITY_SOURCES: readonly KvCapacitySource[] = [VLLM_KV_CAPACITY, SGLANG_KV_CAPACITY];

/** The KV tokens `source` states in `samples`; 0 when it states none. */
export function kvCapacityOf(samples: readonly Sample[], source: KvCapacitySource): number {
  return source.kind === "cache-config-info"
    ? kvTokensOf(samples, source.name)
    : tokenGaugeOf(samples, source.name);
}

/** The first source in `sources` that states a figure, and that figure; 0 when none does. */
export function kvCapacityOfAny(samples: readonly Sample[], sources = KV_CAPACITY_SOURCES): number {
  for (const s of sources) {
    const tokens = kvCapacityOf(samples, s);
    if (tokens > 0) return tokens;
  }
  return 0;
}

/** num_gpu_blocks × block_size of each engine's cache-config series (one per data-parallel engine), summed; 0 when none. */
export function kvTokensOf(samples: readonly Sample[], name: string = VLLM_CACHE_CONFIG_INFO): number {
  let total = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    const blocks = Number(s.labels.num_gpu_blocks);
    const size = Number(s.labels.block_size);
    if (Number.isSafeInteger(blocks) && Number.isSafeInteger(size) && blocks > 0 && size > 0)
      total += blocks * size;
  }
  return exact(total);
}

function tokenGaugeOf(samples: readonly Sample[], name: string): number {
  const perDpRank = new Map<string, number>();
  for (const s of samples) {
    if (s.name !== name || !Number.isSafeInteger(s.value) || s.value <= 0) continue;
    const rank = s.labels.dp_rank ?? "";
    perDpRank.set(rank, Math.max(perDpRank.get(rank) ?? 0, s.value));
  }
  let total = 0;
  for (const v of perDpRank.values()) total += v;
  return exact(total);
}

/** A sum past what a number holds exactly is no figure at all: unknown. */
function exact(total: number): number {
  return Number.isSafeInteger(total) ? total : 0;
}
