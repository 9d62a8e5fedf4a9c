/**
 * How long one engine step (one forward pass over the batch) takes, as a
 * roofline: a step must stream every weight once (memory bound) or do the
 * matmuls for every scheduled token (compute bound), whichever is slower;
 * then it reads the KV cache of every token the batch attends to, and pays
 * a small per-sequence cost (sampling, attention metadata, detokenizing).
 *
 *   t_step = overhead
 *          + max(weights_read, tokens_in_step × compute_per_token)
 *          + context_tokens × kv_read_per_token
 *          + sequences × per_sequence
 *
 * Defaults: Llama-3.1-8B-Instruct, BF16, one H100 SXM 80 GB (3.35 TB/s HBM3,
 * 989 dense BF16 TFLOP/s), vLLM V1 with chunked prefill. Physics sets the
 * weights and KV terms; the other three are fitted so that every V1-era
 * published vLLM figure in calibration.ts is within ±20 % (the table is in
 * docs/sim-engine.md and `npm run bench:sim-engine` prints it):
 *
 * - weights_read 6.2 ms: 16.06 GB of weights at 77 % of 3.35 TB/s. 77 % is
 *   the share of the bandwidth roofline a published vLLM sweep of the same
 *   model reached at one stream on an A100 (~75 tok/s; johnmusgrave.com
 *   "vLLM throughput-latency sweep on NVIDIA A100").
 * - overhead 1.0 ms: scheduling, launches and the sampler's fixed cost. With
 *   the weights read it puts single-stream ITL at 7.2 ms (~138 tok/s),
 *   between the two V1-era low-load figures: vLLM 0.21's TPOT of 6.48 ms
 *   and the ~8.5 ms the V1 alpha's 1.7 s mean latency at 1 QPS implies for
 *   ShareGPT's ~200-token answers. Only a single-stream ITL of ~6.8–7.8 ms
 *   keeps both within ±20 %.
 * - compute_per_token 22 µs: 2 × 8.03 G FLOP per token at ~74 % of peak
 *   (~45k prefill tok/s; TTFT of a 1,024-token prompt on an idle engine
 *   ≈ 24 ms). Set by the throughput-bound points: MLPerf's FP8 offline run
 *   (prefill-heavy) and the V1 alpha at 40–50 QPS.
 * - kv_read_per_token 0.051 µs: 128 KiB of KV per token (32 layers × 8 KV
 *   heads × 128 × 2 (K,V) × 2 bytes) at the same 77 % of bandwidth.
 * - per_sequence 32 µs: what grows with the batch besides matmuls and KV
 *   reads (sampling, batch preparation, per-sequence attention work), fitted
 *   to the V1 alpha's latency at 40–50 QPS (8 ms a step at 256 sequences).
 *   It was 60 µs, which made high-batch steps with short contexts 1.5–2×
 *   too slow: 0.66–0.69 of vLLM 0.6's burst throughput and 1.8× the V1
 *   alpha's latency at 40–50 QPS.
 *
 * Pure arithmetic: a benchmark can drive it with a virtual clock.
 */

export interface LatencyParams {
  overheadMs: number;
  weightsReadMs: number;
  computeUsPerToken: number;
  kvReadUsPerToken: number;
  perSequenceUs: number;
}

export const H100_LLAMA_3_1_8B: Readonly<LatencyParams> = Object.freeze({
  overheadMs: 1,
  weightsReadMs: 6.2,
  computeUsPerToken: 22,
  kvReadUsPerToken: 0.051,
  perSequenceUs: 32,
});

/** What a step does, as far as its cost is concerned. */
export interface BatchShape {
  /** Sequences in the step (decoding and prefilling). */
  sequences: number;
  /** New tokens computed in the step: 1 per decoding sequence plus prefill chunks. */
  tokens: number;
  /** Tokens whose KV the step attends to: Σ over sequences of (computed + new). */
  contextTokens: number;
}

export function stepSeconds(p: LatencyParams, b: BatchShape): number {
  if (b.sequences === 0) return 0;
  const ms =
    p.overheadMs +
    Math.max(p.weightsReadMs, (b.tokens * p.computeUsPerToken) / 1000) +
    (b.contextTokens * p.kvReadUsPerToken) / 1000 +
    (b.sequences * p.perSequenceUs) / 1000;
  return ms / 1000;
}

/**
 * Tensor and pipeline parallelism split the weights, the matmuls and the KV
 * over `gpus`, but every doubling costs ~10 % in all-reduce and bubbles, so
 * the speed-up is gpus × 0.9^log2(gpus). The fixed overhead does not shrink.
 */
export function scaleForParallelism(
  p: LatencyParams,
  tensorParallel: number,
  pipelineParallel: number,
): LatencyParams {
  const gpus = Math.max(1, tensorParallel) * Math.max(1, pipelineParallel);
  if (gpus === 1) return { ...p };
  const speedup = gpus * 0.9 ** Math.log2(gpus);
  return {
    overheadMs: p.overheadMs,
    weightsReadMs: p.weightsReadMs / speedup,
    computeUsPerToken: p.computeUsPerToken / speedup,
    kvReadUsPerToken: p.kvReadUsPerToken / speedup,
    perSequenceUs: p.perSequenceUs,
  };
}

/** Memory facts used to size the KV cache like vLLM does at startup. */
export interface MemoryModel {
  gpuMemoryGiB: number;
  weightsGB: number;
  /** Activations, CUDA graphs and the non-torch allocations vLLM profiles per GPU. */
  reservedGiBPerGpu: number;
  kvBytesPerToken: number;
}

export const H100_80GB_LLAMA_3_1_8B_MEMORY: Readonly<MemoryModel> = Object.freeze({
  gpuMemoryGiB: 80,
  weightsGB: 16.06,
  reservedGiBPerGpu: 3,
  kvBytesPerToken: 131_072,
});

/**
 * vLLM's sizing: usable = memory × utilization − weights − reserved, over all
 * GPUs of the replica (the KV is sharded with the weights); blocks = usable /
 * (kv bytes per token × block size). ~27k blocks (~440k tokens) by default.
 */
export function kvBlocksFor(
  m: MemoryModel,
  gpuMemoryUtilization: number,
  gpus: number,
  blockSize: number,
): number {
  const GiB = 1024 ** 3;
  const usable =
    gpus * (m.gpuMemoryGiB * GiB * gpuMemoryUtilization - m.reservedGiBPerGpu * GiB) - m.weightsGB * 1e9;
  return Math.max(0, Math.floor(usable / (m.kvBytesPerToken * blockSize)));
}
