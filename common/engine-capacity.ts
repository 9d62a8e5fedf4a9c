/**
 * What an engine's KV cache holds, as its own `/metrics` says: vLLM (and the
 * sim engine) export the cache's configuration as an info metric whose
 * labels carry `num_gpu_blocks` and `block_size`. The agent reads it off the
 * engines it launched, the control plane off static endpoints; the batch
 * (`max_num_seqs`) is not among vLLM's metrics, so it comes from the
 * engine's arguments or the operator, never from here.
 */
import type { Sample } from "./prometheus-text.ts";

export const VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info";

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
  // A sum past what a number holds exactly is no figure at all: unknown.
  return Number.isSafeInteger(total) ? total : 0;
}
