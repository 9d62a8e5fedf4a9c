/**
 * How full an endpoint and a pool are (docs/routing.md, "Admission"). Each
 * signal is divided by its target, so 1.0 means "at target":
 *
 *   endpoint saturation = max(in_flight / max(seq_ceiling × max_num_seqs,
 *                                             min(seq_floor, max_num_seqs)),
 *                             charged tokens / (kv_ceiling × KV tokens),
 *                             prefilling / target_prefilling,
 *                             waiting / target_waiting,
 *                             kv_usage / kv_ceiling)
 *   pool saturation     = mean over routable endpoints
 *
 * The first three are the pool's own: every admit charges its request's
 * predicted demand (a sequence, and its prompt and answer in tokens) and
 * every release frees it; a stream also counts as prefilling until the
 * Worker reports its first token. So they move with each decision and a
 * burst is judged from its first request. They need the engine's capacity; where it
 * is unknown, the batch is assumed to be vLLM's default and the token term
 * is left out. The last two are scraped, seconds late, and can only raise
 * the figure: they catch what the pool cannot see (work sent around it,
 * prompts longer than estimated). A scraped signal older than `stale_after`
 * decays linearly toward 1.0 over another `stale_after` — pessimistic,
 * never toward 0, so a silent engine stops looking idle. One exception,
 * after the anchors' fail-open lesson: when no endpoint of the pool has a
 * fresh sample, the fault is the load feed (control plane or agents down),
 * not every engine at once, and the scraped terms are left out rather than
 * decayed: the pool then admits on its own exact charges alone instead of
 * shutting every band out. An endpoint never scraped (router-only mode) is
 * judged on its charges alone.
 */
import type { ScoringConfig } from "../config/router.ts";
import type { Capacity, LoadSample } from "./types.ts";

/**
 * vLLM's default `max_num_seqs` (and the sim engine's), assumed for an
 * endpoint whose capacity nobody stated or scraped, scaled by its weight.
 */
export const ASSUMED_MAX_NUM_SEQS = 256;

export interface SaturationInput {
  inflight: number;
  /** Predicted tokens of the requests in flight (the pool's charges). */
  tokens: number;
  /**
   * The streams admitted whose first token has not come, each weighed as a
   * whole prompt or the fraction of one its length makes (pool-core.ts):
   * the engine's queue of prefills, as the pool sees it now.
   */
  prefillLoad: number;
  weight: number;
  capacity: Capacity | undefined;
  load: LoadSample | undefined;
}

export interface Signals {
  waiting: number;
  kv: number;
  inflight: number;
  tokens: number;
  prefilling: number;
}

/**
 * Requests in flight at which an endpoint counts as saturated: `seq_ceiling`
 * of its batch, but never fewer than `seq_floor` (or the whole batch, if
 * that is smaller), since a batch that small costs a step little more than
 * one sequence does.
 */
export function inflightTarget(e: Pick<SaturationInput, "weight" | "capacity">, s: ScoringConfig): number {
  if (s.target_inflight !== undefined) return s.target_inflight * e.weight;
  const seqs = e.capacity?.maxSeqs ?? ASSUMED_MAX_NUM_SEQS * e.weight;
  return Math.max(seqs * s.seq_ceiling, Math.min(seqs, s.seq_floor));
}

/** A value aged past `staleMs`, moved toward 1.0 in proportion to how far past. */
export function decayTowardOne(value: number, ageMs: number, staleMs: number): number {
  if (ageMs <= staleMs) return value;
  const w = staleMs > 0 ? Math.min(1, (ageMs - staleMs) / staleMs) : 1;
  return value + (1 - value) * w;
}

/** Each signal over its target, scraped ones decayed by age; `scraped: false` leaves those at 0. */
export function signals(
  e: SaturationInput,
  s: ScoringConfig,
  staleMs: number,
  now: number,
  scraped: boolean,
): Signals {
  const inflight = e.inflight / inflightTarget(e, s);
  const kvTokens = e.capacity?.kvTokens;
  const tokens = kvTokens ? e.tokens / (kvTokens * s.kv_ceiling) : 0;
  const prefilling = e.prefillLoad / (s.target_prefilling * e.weight);
  if (!scraped || !e.load) return { waiting: 0, kv: 0, inflight, tokens, prefilling };
  const age = Math.max(0, now - e.load.at);
  return {
    waiting: decayTowardOne(e.load.waiting / s.target_waiting, age, staleMs),
    kv: decayTowardOne(e.load.kvUsage / s.kv_ceiling, age, staleMs),
    inflight,
    tokens,
    prefilling,
  };
}

/** What admission compares with the bands' ceilings: every signal, the queue of prefills included. */
export const saturationOf = (g: Signals): number => Math.max(engineSaturation(g), g.prefilling);

/** What picking compares (spill-over, affinity's release, the load tier): the engine's batch and memory. */
export const engineSaturation = (g: Signals): number => Math.max(g.waiting, g.kv, g.inflight, g.tokens);

/** Whether any sample of the pool is fresh; if none is, the feed is down and scraped terms are ignored. */
export function feedIsLive(loads: Iterable<LoadSample | undefined>, staleMs: number, now: number): boolean {
  for (const l of loads) if (l && now - l.at <= staleMs) return true;
  return false;
}

export function poolSaturation(endpointSaturations: readonly number[]): number {
  if (endpointSaturations.length === 0) return Number.POSITIVE_INFINITY;
  let sum = 0;
  for (const v of endpointSaturations) sum += v;
  return sum / endpointSaturations.length;
}
