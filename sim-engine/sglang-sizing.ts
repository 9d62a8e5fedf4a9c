/**
 * How SGLang sizes itself at start, on the sim's simulated GPUs (Llama 3.1
 * 8B on H100s, latency-model.ts): the KV pool from --mem-fraction-static,
 * the request length limits from it and the context length, and the batch
 * from the pool when --max-running-requests is not given. The result is the
 * sim engine's own config (flags.ts' SimEngineFlags), so the engine
 * underneath is the one the vLLM persona runs.
 */
import { FlagError, type SimEngineFlags } from "./flags.ts";
import { H100_80GB_LLAMA_3_1_8B_MEMORY } from "./latency-model.ts";
import type { SglangFlags } from "./sglang-flags.ts";

/** Llama 3.1's context window, what SGLang reads from the model's config when --context-length is not given. */
export const MODEL_CONTEXT_LENGTH = 131_072;

/** What SGLang worked out at start, per data-parallel rank (each is a scheduler with its own pool). */
export interface SglangSizing {
  memFractionStatic: number;
  /** `max_total_num_tokens`: the KV pool's tokens, page-aligned. */
  maxTotalNumTokens: number;
  contextLength: number;
  maxReqLen: number;
  maxReqInputLen: number;
  /** The batch: `effective_max_running_requests_per_dp`. */
  maxRunningRequests: number;
  chunkedPrefillSize: number;
  /** GiB on each GPU, as /get_server_info's memory_usage says it. */
  weightGiB: number;
  kvCacheGiB: number;
}

const GiB = 1024 ** 3;

/**
 * SGLang's default --mem-fraction-static by tensor-parallel size
 * (python/sglang/srt/server_args.py, `_handle_gpu_memory_settings` in
 * current versions derives it from the GPU's memory instead; on an 80 GB
 * H100 both land near 0.88 at TP 1).
 */
export function defaultMemFraction(tp: number): number {
  if (tp >= 16) return 0.79;
  if (tp >= 8) return 0.81;
  if (tp >= 4) return 0.85;
  if (tp >= 2) return 0.87;
  return 0.88;
}

/** SGLang's default chunked prefill by GPU memory (server_args.py): 2048 under 35 GiB, 8192 under 160, else 16384. */
export function defaultChunkedPrefill(gpuMemoryGiB: number): number {
  if (gpuMemoryGiB < 35) return 2048;
  if (gpuMemoryGiB < 160) return 8192;
  return 16384;
}

/**
 * The batch when --max-running-requests is not given, as SGLang derives it
 * from the KV pool (python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py,
 * `resolve_max_num_reqs`, with python/sglang/srt/managers/tp_worker.py's
 * `max_total_num_tokens // 2` cap): the request pool holds
 * `tokens / context_len × 512` requests, kept within 2048..4096, and never
 * more than one request per two KV tokens. When it is given, SGLang divides
 * it among attention data-parallel ranks (only with --enable-dp-attention;
 * plain --dp-size gives each rank a scheduler with the whole figure) and
 * caps it the same way.
 */
export function derivedBatch(tokens: number, contextLength: number, given?: number, attnDp = 1): number {
  if (given !== undefined) return Math.min(Math.floor(given / attnDp), Math.floor(tokens / 2));
  const estimated = Math.max(Math.min(Math.floor((tokens / contextLength) * 512), 4096), 2048);
  return Math.min(estimated, Math.floor(tokens / 2));
}

/**
 * The KV pool SGLang profiles at start: each GPU keeps `mem_fraction_static`
 * of its memory for weights and KV, the weights take their share, the KV
 * gets the rest (model_runner_kv_cache_mixin.py, `profile_max_num_token`);
 * capped by --max-total-tokens and cut to whole pages.
 */
function poolTokens(f: SglangFlags, gpus: number, mfs: number): number {
  const m = H100_80GB_LLAMA_3_1_8B_MEMORY;
  const perGpu = f.sim.gpuMemoryGiB * GiB * mfs - (m.weightsGB * 1e9) / gpus;
  let tokens = Math.floor((perGpu * gpus) / m.kvBytesPerToken);
  if (f.sim.kvBlocks !== undefined) tokens = f.sim.kvBlocks * f.pageSize;
  if (f.maxTotalTokens !== undefined) tokens = Math.min(tokens, f.maxTotalTokens);
  return Math.floor(tokens / f.pageSize) * f.pageSize;
}

export function sglangSizing(f: SglangFlags): SglangSizing {
  const gpus = f.tpSize * f.ppSize;
  const mfs = f.memFractionStatic ?? defaultMemFraction(f.tpSize);
  const tokens = poolTokens(f, gpus, mfs);
  // SGLang's own words for a pool it cannot make.
  if (tokens <= 0) throw new FlagError("Not enough memory. Please try to increase --mem-fraction-static.");
  const contextLength = f.contextLength ?? MODEL_CONTEXT_LENGTH;
  const maxReqLen = Math.min(contextLength - 1, tokens - 1);
  const maxReqInputLen = maxReqLen - 5;
  if (maxReqInputLen <= 0) throw new FlagError("Memory pool size is too small");
  const attnDp = f.enableDpAttention ? f.dpSize : 1;
  const maxRunningRequests = derivedBatch(tokens, contextLength, f.maxRunningRequests, attnDp);
  if (maxRunningRequests <= 0) throw new FlagError("--max-running-requests: max_running_request is zero");
  const chunkedPrefillSize = f.chunkedPrefillSize ?? defaultChunkedPrefill(f.sim.gpuMemoryGiB);
  if (chunkedPrefillSize > 0 && chunkedPrefillSize % f.pageSize !== 0) {
    throw new FlagError(
      `--chunked-prefill-size: ${chunkedPrefillSize} is not a multiple of --page-size ${f.pageSize}`,
    );
  }
  const m = H100_80GB_LLAMA_3_1_8B_MEMORY;
  const round2 = (x: number) => Math.round(x * 100) / 100;
  return {
    memFractionStatic: mfs,
    maxTotalNumTokens: tokens,
    contextLength,
    maxReqLen,
    maxReqInputLen,
    maxRunningRequests,
    chunkedPrefillSize,
    weightGiB: round2((m.weightsGB * 1e9) / gpus / GiB),
    kvCacheGiB: round2((tokens * m.kvBytesPerToken) / gpus / GiB),
  };
}

/** The sim engine's config for these SGLang flags and sizing: one engine core per DP rank. */
export function simFlagsOf(f: SglangFlags, s: SglangSizing): SimEngineFlags {
  return {
    model: f.modelPath,
    host: f.host,
    port: f.port,
    servedModelNames: [f.servedModelName],
    tensorParallelSize: f.tpSize,
    pipelineParallelSize: f.ppSize,
    dataParallelSize: f.dpSize,
    nnodes: f.nnodes,
    nodeRank: f.nodeRank,
    headless: false,
    gpuMemoryUtilization: s.memFractionStatic,
    // The context check is SGLang's own (sglang-persona.ts); the engine only needs it to fit.
    maxModelLen: Math.min(s.contextLength, s.maxTotalNumTokens),
    maxNumSeqs: s.maxRunningRequests,
    // SGLang's prefill budget per step: a chunk, within max_prefill_tokens; no chunking, max_prefill_tokens.
    maxNumBatchedTokens:
      s.chunkedPrefillSize > 0 ? Math.min(s.chunkedPrefillSize, f.maxPrefillTokens) : f.maxPrefillTokens,
    enablePrefixCaching: !f.disableRadixCache,
    blockSize: f.pageSize,
    seed: f.randomSeed ?? 0,
    enablePromptTokensDetails: f.enableCacheReport,
    enableAutoToolChoice: f.toolCallParser !== undefined,
    ...(f.toolCallParser !== undefined ? { toolCallParser: f.toolCallParser } : {}),
    // SGLang's --api-key is the persona's to check, by SGLang's rule (sglang-persona.ts), not vLLM's.
    apiKeys: [],
    // The pool in pages: the KV cache's blocks are SGLang's pages.
    sim: { ...f.sim, kvBlocks: s.maxTotalNumTokens / f.pageSize },
    // SGLang runs uvicorn with timeout_keep_alive=5 (http_server.py), not configurable.
    httpKeepAliveSeconds: 5,
    ignored: f.ignored,
  };
}
