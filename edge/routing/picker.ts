/**
 * Picking an endpoint, as a pipeline of small pure stages (after the
 * Inference Extension's filter → score → pick):
 *
 *   routable (engine state, breaker) → site (the nearest site that can take
 *   the request, site-preference.ts) → spill-over (the best spill group that
 *   can take the request) → policy
 *
 * and for the `chat` policy, three tiers, the first that decides wins:
 *
 * 1. session: the endpoint this session was last routed to, unless it is
 *    saturated or has more requests in flight than `session_load_factor` ×
 *    the pool's mean, and AFFINITY_SLACK_REQUESTS (3) more;
 * 2. prefix: the endpoint holding the longest run of this prompt's blocks
 *    (at least half of them), under the same load guard — affinity is a
 *    filter with a release, not a weight, because a weighted blend sends a
 *    burst of one prompt to one engine (the anchors' hot-spot lesson);
 * 3. load: among the endpoints under saturation, of those less than one
 *    request and a tenth above the fewest in flight per unit of weight — the pool's
 *    own exact count (what the anchors converged on after herding on
 *    scraped numbers: every decision between two scrapes sees the same
 *    ones) — the one picked longest ago.
 *
 * `round-robin`, `least-load` and `random` are the benchmark's baselines.
 * Every stage says why it set an endpoint aside, so the pool's status can
 * explain a decision without re-running it.
 */
import type { Candidate, Filtered } from "./candidate.ts";
import type { MatchLevel } from "./prefix-index.ts";
import { interleaveBySite, type SiteStageContext, siteOf, sitePreference } from "./site-preference.ts";
import type { Rejection, RouteTier, RoutingPolicy } from "./types.ts";

export type { Candidate, Filtered } from "./candidate.ts";

export interface PickContext {
  policy: RoutingPolicy;
  /** The endpoint the request's session is pinned to, if any. */
  sessionEndpoint: string | undefined;
  /** Blocks the request's prompt was hashed into. */
  prefixBlocks: number;
  /** Longest-first prefix matches among the given endpoints (the index, lazily). */
  prefixMatch: (eligible: (id: string) => boolean) => MatchLevel[];
  sessionLoadFactor: number;
  /** Alternates to rank for retries. */
  alternates: number;
  random: () => number;
  /** Round-robin position, advanced by the caller. */
  turn: number;
  /** The site stage's view of the request; absent: no site stage (one site, the baselines' benchmarks). */
  sites?: Omit<SiteStageContext, "sessionSite" | "random"> | undefined;
}

export interface Pick {
  chosen: Candidate;
  alternates: Candidate[];
  tier: RouteTier;
  /** For `prefix`: blocks matched. */
  matchedBlocks: number;
}

/** A prefix match must cover at least this share of the hashed prompt to decide. */
export const MIN_PREFIX_SHARE = 0.5;

export function routable(all: readonly Candidate[]): Filtered {
  const kept: Candidate[] = [];
  const rejected: Rejection[] = [];
  for (const c of all) {
    if (c.state === "draining" || c.state === "down") {
      rejected.push({ endpoint: c.spec.id, stage: "state", reason: `engine is ${c.state}` });
    } else if (c.breaker === "open") {
      rejected.push({ endpoint: c.spec.id, stage: "breaker", reason: "breaker open" });
    } else if (c.probing) {
      rejected.push({ endpoint: c.spec.id, stage: "breaker", reason: "breaker half-open, probe in flight" });
    } else kept.push(c);
  }
  return { kept, rejected };
}

/** Can take requests at all (a probe in flight aside): what admission counts as capacity. */
export function isRoutable(c: Candidate): boolean {
  return c.state !== "draining" && c.state !== "down" && c.breaker !== "open";
}

export function describeUnroutable(cands: readonly Candidate[]): string {
  const open = cands.filter((c) => c.breaker === "open").length;
  const out = cands.filter((c) => c.state === "draining" || c.state === "down").length;
  const parts: string[] = [];
  if (open > 0) parts.push(`${open} with an open circuit breaker`);
  if (out > 0) parts.push(`${out} draining or down`);
  return parts.join(", ") || "none routable";
}

const spillOrder = (a: Candidate, b: Candidate) =>
  a.spec.priority - b.spec.priority ||
  (a.spec.spillGroup < b.spec.spillGroup ? -1 : a.spec.spillGroup > b.spec.spillGroup ? 1 : 0);

/**
 * Spill-over: the first spill group by priority with an endpoint under
 * saturation takes the request; groups after it wait. If every group is
 * saturated the first one takes it (flow control admitted the request; someone must).
 */
export function spillOver(cands: readonly Candidate[]): Filtered {
  if (cands.length === 0) return { kept: [], rejected: [] };
  const sorted = [...cands].sort(spillOrder);
  const open = sorted.find((c) => c.saturation < 1) ?? sorted[0]!;
  const kept: Candidate[] = [];
  const rejected: Rejection[] = [];
  for (const c of sorted) {
    if (c.spec.spillGroup === open.spec.spillGroup) kept.push(c);
    else
      rejected.push({
        endpoint: c.spec.id,
        stage: "spill-over",
        reason:
          spillOrder(c, open) > 0
            ? `spill group ${c.spec.spillGroup} (priority ${c.spec.priority}) waits while spill group ${open.spec.spillGroup} can take requests`
            : `spill group ${c.spec.spillGroup} is saturated`,
      });
  }
  return { kept, rejected };
}

/** Less busy: fewer requests in flight per unit of weight, then less saturated. */
function lighter(a: Candidate, b: Candidate): number {
  return a.pressure - b.pressure || a.saturation - b.saturation;
}

function lowest(cands: readonly Candidate[], random: () => number): Candidate {
  let best = cands[0]!;
  let ties = 1;
  for (let i = 1; i < cands.length; i++) {
    const c = cands[i]!;
    const d = lighter(c, best);
    if (d < 0) {
      best = c;
      ties = 1;
    } else if (d === 0 && random() * ++ties < 1) best = c;
  }
  return best;
}

function byWeight(cands: readonly Candidate[], random: () => number, skip?: Candidate): Candidate {
  let total = 0;
  for (const c of cands) if (c !== skip) total += c.spec.weight;
  let r = random() * total;
  for (const c of cands) {
    if (c === skip) continue;
    r -= c.spec.weight;
    if (r < 0) return c;
  }
  return cands.findLast((c) => c !== skip)!;
}

/**
 * The near-best, among the endpoints under saturation (all of them if none
 * is): of those less than one request and a tenth in flight (per unit of
 * weight) above the least busy, the one picked longest ago. In-flight counts are exact
 * and move with every decision, so this balances like least-load; taking
 * turns among equals spreads consecutive arrivals, whose prefills would
 * otherwise pile into one engine's next step (the one that just finished
 * requests and so looks emptiest to all of them): in bench:routing's
 * simulation, strict least-load doubled TTFT p90 on low-sharing traffic
 * against round-robin; with the tenth it matches it.
 */
export function nearBest(all: readonly Candidate[]): Candidate {
  const open = all.filter((c) => c.saturation < 1);
  const cands = open.length > 0 ? open : all;
  let least = Number.POSITIVE_INFINITY;
  for (const c of cands) least = Math.min(least, c.pressure);
  let best: Candidate | undefined;
  for (const c of cands) {
    if (c.pressure >= least + 1 + least / 10) continue;
    if (!best || c.lastPick < best.lastPick) best = c;
  }
  return best!;
}

/**
 * Affinity is let go only when both gaps are real (as SGLang's imbalance
 * switch): the warm endpoint has more than factor × the requests in flight
 * of the pool's mean, and more than this many requests over it. In-flight
 * counts: they are exact, while scraped KV and queue figures differ between
 * engines by more than one request's worth anyway.
 */
export const AFFINITY_SLACK_REQUESTS = 3;

/** The affinity guard: not saturated, and not busier than the pool's mean beyond factor and slack. */
function withinGuard(c: Candidate, mean: number, factor: number): boolean {
  return c.saturation < 1 && c.pressure <= Math.max(factor * mean, mean + AFFINITY_SLACK_REQUESTS);
}

function byPrefix(
  cands: readonly Candidate[],
  ctx: PickContext,
  mean: number,
): [Candidate, number] | undefined {
  if (ctx.prefixBlocks === 0) return undefined;
  const need = Math.max(1, Math.ceil(ctx.prefixBlocks * MIN_PREFIX_SHARE));
  const byId = new Map(cands.map((c) => [c.spec.id, c]));
  for (const level of ctx.prefixMatch((id) => byId.has(id))) {
    if (level.blocks < need) break;
    let warm: Candidate | undefined;
    for (const id of level.endpoints) {
      const c = byId.get(id)!;
      if (!warm || lighter(c, warm) < 0) warm = c;
    }
    if (warm && withinGuard(warm, mean, ctx.sessionLoadFactor)) return [warm, level.blocks];
  }
  return undefined;
}

function decide(cands: readonly Candidate[], ctx: PickContext): [Candidate, RouteTier, number] {
  switch (ctx.policy) {
    case "round-robin": {
      const sorted = [...cands].sort((a, b) => (a.spec.id < b.spec.id ? -1 : 1));
      return [sorted[ctx.turn % sorted.length]!, "round-robin", 0];
    }
    case "random":
      return [byWeight(cands, ctx.random), "random", 0];
    case "least-load":
      return [lowest(cands, ctx.random), "least-load", 0];
    case "chat": {
      let mean = 0;
      for (const c of cands) mean += c.pressure;
      mean /= cands.length;
      if (ctx.sessionEndpoint !== undefined) {
        const pinned = cands.find((c) => c.spec.id === ctx.sessionEndpoint);
        if (pinned && withinGuard(pinned, mean, ctx.sessionLoadFactor)) return [pinned, "session", 0];
      }
      const warm = byPrefix(cands, ctx, mean);
      if (warm) return [warm[0], "prefix", warm[1]];
      return [nearBest(cands), "load", 0];
    }
  }
}

/**
 * Alternates for retries, so a retry needs no second call to the pool: the
 * rest of the chosen spill group, least busy first, then the other groups in
 * spill-over order, taken in turn from each site (a site lost whole refuses
 * every retry sent there). Only closed breakers: a half-open endpoint gets its probe from the
 * pool, not from a retry.
 */
function rank(all: readonly Candidate[], chosen: Candidate, ctx: PickContext): Candidate[] {
  if (ctx.alternates <= 0) return [];
  const ranked = all
    .filter((c) => c !== chosen && c.breaker === "closed")
    .sort(
      (a, b) =>
        Number(b.spec.spillGroup === chosen.spec.spillGroup) -
          Number(a.spec.spillGroup === chosen.spec.spillGroup) ||
        spillOrder(a, b) ||
        lighter(a, b),
    );
  const spread = ctx.sites ? interleaveBySite(ranked, siteOf(chosen), ctx.sites.order.sites) : ranked;
  return spread.slice(0, ctx.alternates);
}

/** Runs the pipeline; undefined when no endpoint is routable (the rejections say why). */
export function pick(
  all: readonly Candidate[],
  ctx: PickContext,
  rejected: Rejection[] = [],
): Pick | undefined {
  const r = routable(all);
  rejected.push(...r.rejected);
  let near: Filtered = { kept: r.kept, rejected: [] };
  if (ctx.sites) {
    const pinned = r.kept.find((c) => c.spec.id === ctx.sessionEndpoint);
    near = sitePreference(r.kept, {
      ...ctx.sites,
      sessionSite: pinned ? siteOf(pinned) : undefined,
      random: ctx.random,
    });
    rejected.push(...near.rejected);
  }
  const s = spillOver(near.kept);
  rejected.push(...s.rejected);
  if (s.kept.length === 0) return undefined;
  const [chosen, tier, matchedBlocks] = decide(s.kept, ctx);
  return { chosen, tier, matchedBlocks, alternates: rank(r.kept, chosen, ctx) };
}
