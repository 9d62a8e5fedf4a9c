/**
 * A profile that changed (its source, engine_args, env, parallelism…), or
 * an engine key secret that was rotated, replaces the replicas that run the
 * older spec or key a few at a time, make before break, as a Kubernetes
 * Deployment rolls: `max_surge` replacements are placed beyond the wanted
 * count, and a replica that serves is drained only once enough others serve
 * that at most `max_unavailable` of the wanted are missing. A replacement
 * that fails therefore never costs a serving replica: it goes into the
 * model's backoff and the older ones keep serving.
 *
 * `paused` holds it where it stands: nothing is placed for it, drained or
 * restarted until it is lifted, while other placements (a failure's, a
 * scale-up's) run the profile as it is. A canary is `max_surge: 1`, then
 * `paused: true` once the first replacement serves.
 *
 * Pure: the planner (plan.ts) hands it a profile's replicas that stay after
 * surplus and node drains, and turns the answer into actions.
 */
import type { CatalogProfile } from "../catalog.ts";
import { specMismatch } from "./spec.ts";
import type { ReplicaRecord } from "./types.ts";

export interface Outdated {
  replica: ReplicaRecord;
  /** What differs from the profile (spec.ts), or that its key is retired. */
  why: string;
}

export interface RolloutSplit {
  /** Outdated and not serving: nothing is lost by stopping them now; they are placed again as the profile is. */
  restart: Outdated[];
  /** Outdated, serving, and being replaced: not counted toward the wanted replicas, so replacements are placed. */
  leaving: Outdated[];
  /** Counted toward the wanted replicas: current ones, and outdated ones whose turn has not come. */
  staying: ReplicaRecord[];
}

/**
 * Why a replica is to be replaced: its spec is not its profile's now
 * (spec.ts), or its engine's key derives from a secret rotated away.
 * Undefined when neither, or when its spec is not known yet.
 */
export function outdatedWhy(
  r: ReplicaRecord,
  prof: CatalogProfile,
  retiredKeys?: ReadonlyMap<string, number>,
): string | undefined {
  const mismatch = specMismatch(r.spec, prof);
  if (mismatch !== undefined) return mismatch;
  if (retiredKeys?.get(r.id) === r.generation)
    return "its engine key derives from a rotated secret (llmgw ctl engine-keys rotate)";
  return undefined;
}

/**
 * Sorts a profile's staying replicas by whether, and when, the rollout
 * replaces them. While paused the turn is still taken (so a replacement
 * already placed is not counted as surplus), but nothing is restarted.
 */
export function splitOutdated(
  replicas: readonly ReplicaRecord[],
  prof: CatalogProfile,
  ready: (r: ReplicaRecord) => boolean,
  retiredKeys?: ReadonlyMap<string, number>,
): RolloutSplit {
  const split: RolloutSplit = { restart: [], leaving: [], staying: [] };
  const serving: Outdated[] = [];
  for (const replica of replicas) {
    const why = outdatedWhy(replica, prof, retiredKeys);
    if (why === undefined) split.staying.push(replica);
    else if (ready(replica)) serving.push({ replica, why });
    else if (prof.rollout.paused) split.staying.push(replica);
    else split.restart.push({ replica, why });
  }
  // Lowest index first, so the same replicas stay in turn from pass to pass.
  serving.sort((a, b) => a.replica.index - b.replica.index);
  const turn = prof.rollout.maxSurge + prof.rollout.maxUnavailable;
  split.leaving = serving.slice(0, turn);
  for (const o of serving.slice(turn)) split.staying.push(o.replica);
  return split;
}

/**
 * The leaving replicas that may be drained now: each one only while the
 * ready replicas left after it still number at least the wanted count less
 * `max_unavailable`, and none while paused. `readyStaying` counts the ready
 * replicas that stay.
 */
export function drainable(
  leaving: readonly Outdated[],
  readyStaying: number,
  wanted: number,
  rollout: CatalogProfile["rollout"],
): Outdated[] {
  if (rollout.paused) return [];
  const { maxUnavailable } = rollout;
  let ready = readyStaying + leaving.length;
  const out: Outdated[] = [];
  for (const o of leaving) {
    if (ready - 1 < wanted - maxUnavailable) break;
    out.push(o);
    ready--;
  }
  return out;
}

/**
 * The rollout's part of `llmgw ctl explain MODEL`, one line per profile with
 * replicas still to replace: how many, what differs (the first one's), and
 * how it proceeds. `whys` are the outdated replicas' reasons (outdatedWhy).
 */
export function rolloutLine(prof: CatalogProfile, whys: readonly string[]): string | undefined {
  if (whys.length === 0) return undefined;
  const { maxSurge, maxUnavailable, paused } = prof.rollout;
  const how = paused ? "paused (rollout.paused)" : `max_surge ${maxSurge}, max_unavailable ${maxUnavailable}`;
  return `rollout of ${prof.key}: ${whys.length} replica(s) to replace (${whys[0]}); ${how}`;
}
