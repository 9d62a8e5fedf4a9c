/**
 * How full an endpoint and a pool are, from the three signals design §7
 * names. Each signal is divided by its target, so 1.0 means "at target":
 *
 *   endpoint saturation = max(waiting / target_waiting,
 *                             kv_usage / kv_ceiling,
 *                             in_flight / (target_inflight × weight))
 *   pool saturation     = mean over routable endpoints
 *
 * The in-flight count is the pool's own and always current; waiting and KV
 * come from scrapes and age. A scraped signal older than `stale_after`
 * decays linearly toward 1.0 over another `stale_after` — pessimistic, never
 * toward 0, so a silent engine stops looking idle. One exception, after the
 * anchors' fail-open lesson: when no endpoint of the pool has a fresh
 * sample, the fault is the load feed (control plane or agents down), not
 * every engine at once, and the scraped terms are left out rather than
 * decayed: the pool then admits on its exact in-flight counts alone instead
 * of shutting every band out. An endpoint never scraped (router-only mode)
 * is judged on in-flight alone.
 */
import type { ScoringConfig } from "../router-config.ts";
import type { LoadSample } from "./types.ts";

export interface SaturationInput {
  inflight: number;
  weight: number;
  load: LoadSample | undefined;
}

export interface Signals {
  waiting: number;
  kv: number;
  inflight: number;
}

/** A value aged past `staleMs`, moved toward 1.0 in proportion to how far past. */
export function decayTowardOne(value: number, ageMs: number, staleMs: number): number {
  if (ageMs <= staleMs) return value;
  const w = staleMs > 0 ? Math.min(1, (ageMs - staleMs) / staleMs) : 1;
  return value + (1 - value) * w;
}

/** Each signal over its target, scraped ones decayed by age; `scraped: false` leaves them at 0. */
export function signals(
  e: SaturationInput,
  s: ScoringConfig,
  staleMs: number,
  now: number,
  scraped: boolean,
): Signals {
  const inflight = e.inflight / (s.target_inflight * e.weight);
  if (!scraped || !e.load) return { waiting: 0, kv: 0, inflight };
  const age = Math.max(0, now - e.load.at);
  return {
    waiting: decayTowardOne(e.load.waiting / s.target_waiting, age, staleMs),
    kv: decayTowardOne(e.load.kvUsage / s.kv_ceiling, age, staleMs),
    inflight,
  };
}

export const saturationOf = (g: Signals): number => Math.max(g.waiting, g.kv, g.inflight);

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
