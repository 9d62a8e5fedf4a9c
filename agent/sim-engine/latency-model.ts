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
 * 989 dense BF16 TFLOP/s), vLLM V1 with chunked prefill:
 *
 * - weights_read 5.7 ms: 16.06 GB of weights at 77 % of 3.35 TB/s = 6.2 ms
 *   minus the overhead below. 77 % is the share of the bandwidth roofline a
 *   published vLLM sweep of the same model reached at one stream on an A100
 *   (~75 tok/s; johnmusgrave.com "vLLM throughput-latency sweep on NVIDIA
 *   A100"). Single-stream ITL comes out at 6.3 ms (~160 tok/s).
 * - compute_per_token 32 µs: 2 × 8.03 G FLOP per token at ~50 % of peak,
 *   i.e. ~31k prefill tok/s; TTFT of a 1,024-token prompt ≈ 33 ms + queueing.
 * - kv_read_per_token 0.051 µs: 128 KiB of KV per token (32 layers × 8 KV
 *   heads × 128 × 2 (K,V) × 2 bytes) at the same 77 % of bandwidth.
 * - per_sequence 60 µs, overhead 0.5 ms: the part of a step that grows with
 *   the batch besides KV reads. With these, 64 closed-loop streams of 512
 *   prompt + 128 output tokens predict ~17 ms ITL and ~3.2k output tok/s;
 *   an MLPerf-like load (778 in / 73 out, 256 streams) predicts ~2.1k
 *   output tok/s, against Red Hat's MLPerf Inference v5.1 result for vLLM
 *   0.10 + Llama-3.1-8B on one H100 of 5,103 tok/s (Server) with FP8
 *   weights, i.e. ~2.5–3k for BF16 at half the FLOP/s and bandwidth per
 *   weight. The model is on the conservative side of that figure.
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
  overheadMs: 0.5,
  weightsReadMs: 5.7,
  computeUsPerToken: 32,
  kvReadUsPerToken: 0.051,
  perSequenceUs: 60,
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
