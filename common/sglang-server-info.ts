/**
 * What SGLang's `GET /server_info` (`/get_server_info` before) says of an
 * engine's capacity. Its
 * `/metrics` carry the KV pool's tokens but not the batch, which SGLang
 * sizes from memory at start unless `--max-running-requests` fixes it; the
 * server info carries both: the server arguments at the top level, the
 * first scheduler's figures beside them, and one internal state per
 * data-parallel rank with the batch that rank really runs
 * (`effective_max_running_requests_per_dp`, newer SGLang) and its pool
 * (`memory_usage.token_capacity`).
 *
 * The body also holds the engine's own API key in clear (it echoes every
 * server argument): only the figures below are read from it, and it is
 * never logged or passed on.
 */
import { z } from "zod";

/** Current SGLang serves `/server_info` and keeps `/get_server_info` as a deprecated alias; older SGLang has only the alias. */
export const SGLANG_SERVER_INFO_PATHS = ["/server_info", "/get_server_info"] as const;

/** What an engine says of its capacity; a figure it does not state is absent. */
export interface EngineCapacity {
  maxNumSeqs?: number;
  kvTokens?: number;
}

const count = z.number().int().positive().catch(0);

const internalState = z
  .object({
    effective_max_running_requests_per_dp: count.optional(),
    memory_usage: z.object({ token_capacity: count.optional() }).catch({}).optional(),
  })
  .catch({});

const serverInfo = z.object({
  max_running_requests: count.nullish(),
  max_total_num_tokens: count.optional(),
  dp_size: count.optional(),
  enable_dp_attention: z.boolean().catch(false).optional(),
  internal_states: z.array(internalState).max(1024).catch([]).optional(),
});

/**
 * The batch and KV tokens of a `/get_server_info` body (parsed JSON). Per
 * rank figures add up over the data-parallel ranks; an older SGLang without
 * them falls back to `--max-running-requests` (each rank's, unless DP
 * attention splits it between them) and the first scheduler's pool times
 * `dp_size`. Throws on a body that is not SGLang's server info at all.
 */
export function capacityFromServerInfo(body: unknown): EngineCapacity {
  const parsed = serverInfo.safeParse(body);
  if (!parsed.success) throw new Error("not an SGLang server info: expected a JSON object");
  const info = parsed.data;
  const states = info.internal_states ?? [];
  const perRank = (pick: (s: z.infer<typeof internalState>) => number | undefined) =>
    states.length > 0 && states.every((s) => (pick(s) ?? 0) > 0)
      ? states.reduce((n, s) => n + (pick(s) ?? 0), 0)
      : 0;
  const ranks = info.dp_size || 1;
  const flagged = (info.max_running_requests || 0) * (info.enable_dp_attention ? 1 : ranks);
  const seqs = perRank((s) => s.effective_max_running_requests_per_dp) || flagged;
  const kv = perRank((s) => s.memory_usage?.token_capacity) || (info.max_total_num_tokens ?? 0) * ranks;
  return {
    ...(seqs > 0 ? { maxNumSeqs: seqs } : {}),
    ...(kv > 0 && Number.isSafeInteger(kv) ? { kvTokens: kv } : {}),
  };
}
