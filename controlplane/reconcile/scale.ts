/**
 * The scaling stage: before a reconcile pass, how many replicas each model
 * should have within [replicas.min, replicas.max], from its demand signal
 * (controlplane/scaling/demand.ts). Pure: `scale(input, now)` reads nothing
 * else; the shell keeps the memory it returns and hands the per-profile
 * counts to `plan` (PlanState.desired).
 *
 * Stages, each recording why:
 * 1. per model, a verdict on demand alone (`verdict`): up when the demand
 *    projected over the model's load time would put the current replicas
 *    above target + tolerance; down by one when one replica fewer would still
 *    sit below target - tolerance; otherwise hold. A decision needs half the
 *    window seen, and waits out the cool-downs since the last event;
 * 2. across models (`yieldToPriority`): a model that wants more than the
 *    free GPUs can hold takes replicas above `min` from models of lower
 *    priority, only as many as let its own replicas fit, never below their
 *    `min`;
 * 3. per profile (`spread`): a model's count over its profiles, each from
 *    its own min up to its own max, in config order.
 */
import type { Catalog, CatalogModel, CatalogProfile } from "../catalog.ts";
import { Fleet } from "../placement/fleet.ts";
import { placeReplica } from "../placement/pipeline.ts";
import type { PlacementNode, PortRange } from "../placement/types.ts";
import type { DemandSignal } from "../scaling/demand.ts";
import type { ReplicaRecord } from "./types.ts";
import { isDead } from "./types.ts";

export interface ScaleEvent {
  model: string;
  at: number;
  from: number;
  to: number;
  why: string;
}

/** What the stage remembers per model between passes. */
export interface ScaleMemory {
  desired: number;
  last?: ScaleEvent;
}

export interface ScaleInput {
  catalog: Catalog;
  nodes: readonly PlacementNode[];
  replicas: readonly ReplicaRecord[];
  portRange: PortRange;
  /** Per model: the window's signal (undefined without one) and the newest sample's sources. */
  signals: ReadonlyMap<string, { signal: DemandSignal | undefined; sources: readonly string[] }>;
  memory: ReadonlyMap<string, ScaleMemory>;
}

export interface ModelScale {
  model: string;
  min: number;
  max: number;
  desired: number;
  ready: number;
  /** Place-to-ready time of the model's slowest ready replica, 0 when none was seen. */
  loadMs: number;
  signal: DemandSignal | undefined;
  sources: readonly string[];
  /** This pass's reasoning, one sentence. */
  why: string;
  last?: ScaleEvent;
}

export interface ScaleOutcome {
  models: Map<string, ModelScale>;
  /** Per profile key: the replicas `plan` keeps. */
  desired: Map<string, number>;
  memory: Map<string, ScaleMemory>;
  events: ScaleEvent[];
}

const fmt = (x: number) => x.toFixed(2);
const secs = (ms: number) => `${Math.round(ms / 1000)}s`;

const live = (r: ReplicaRecord) => !r.retire && r.shards.length > 0;
const ready = (r: ReplicaRecord) => live(r) && r.shards.every((s) => s.state === "ready");

/** How long the model took from placement to ready, the slowest replica that still shows it. */
export function loadTimeMs(model: string, replicas: readonly ReplicaRecord[]): number {
  let ms = 0;
  for (const r of replicas) {
    if (r.model !== model || !ready(r) || r.placedAt === undefined || r.origin !== "placed") continue;
    ms = Math.max(ms, Math.max(...r.shards.map((s) => s.since)) - r.placedAt);
  }
  return ms;
}

interface Verdict {
  want: number;
  why: string;
}

/** Stage 1: one model, on its demand alone. */
export function verdict(
  m: CatalogModel,
  bounds: { min: number; max: number },
  current: number,
  signal: DemandSignal | undefined,
  loadMs: number,
  last: ScaleEvent | undefined,
  now: number,
): Verdict {
  const { min, max } = bounds;
  const s = m.scaling;
  if (min === max) return { want: min, why: `fixed: replicas.min = replicas.max = ${min}` };
  if (!s.enabled) return { want: min, why: `fixed at replicas.min ${min}: scaling is disabled` };
  const n = Math.min(max, Math.max(min, current));
  if (!signal) return { want: n, why: `holding ${n}: no demand signal in the window` };
  if (signal.coveredMs < s.windowMs / 2)
    return {
      want: n,
      why: `holding ${n}: the signal covers ${secs(signal.coveredMs)} of the ${secs(s.windowMs)} window, a decision needs half`,
    };
  if (n === 0) return { want: n, why: "holding 0: with no replica there is no saturation to measure" };
  // Ask early for a replica that takes long to load: what the trend says
  // demand will be by the time it is ready. A falling trend never shrinks
  // early, the cool-down already waits for that.
  // The trend is extrapolated no further than the span it was measured on.
  const horizon = Math.min(loadMs, signal.coveredMs);
  const ahead = Math.max(signal.demand, signal.demand + signal.trendPerMs * horizon);
  const upper = s.targetSaturation + s.tolerance;
  const lower = s.targetSaturation - s.tolerance;
  const since = last ? now - last.at : Number.POSITIVE_INFINITY;
  const basis =
    ahead > signal.demand
      ? `demand ${fmt(signal.demand)}, ${fmt(ahead)} in ${secs(horizon)} of loading`
      : `demand ${fmt(ahead)}`;
  if (ahead / n > upper && n < max) {
    const want = Math.min(max, 2 * n, Math.max(n + 1, Math.ceil(ahead / s.targetSaturation)));
    const why = `${basis} puts ${n} replica(s) at ${fmt(ahead / n)}, over ${fmt(upper)}`;
    if (since < s.scaleUpCooldownMs)
      return {
        want: n,
        why: `${why}; up waits for the cool-down (${secs(s.scaleUpCooldownMs - since)} left)`,
      };
    return { want, why: `${why}: up to ${want}` };
  }
  // A scale-down must hold against the window's busiest sample, not only its
  // mean: saturation grows faster than linearly near capacity, so a replica
  // given back on the mean comes back a cool-down later (a flap), and each
  // one costs a whole load to get again.
  const low = Math.max(ahead, signal.peak);
  if (n > min && low / (n - 1) < lower) {
    // One replica at a time, for the same reason.
    const want = n - 1;
    const why = `${basis} (peak ${fmt(signal.peak)}) puts ${n - 1} replica(s) at ${fmt(low / (n - 1))}, under ${fmt(lower)}`;
    if (since < s.scaleDownCooldownMs)
      return {
        want: n,
        why: `${why}; down waits for the cool-down (${secs(s.scaleDownCooldownMs - since)} left)`,
      };
    return { want, why: `${why}: down to ${want}` };
  }
  const at = ahead / n;
  return {
    want: n,
    why:
      n === max && at > upper
        ? `${basis} puts ${n} replica(s) at ${fmt(at)}, over ${fmt(upper)}, but ${n} is replicas.max`
        : `holding ${n}: ${basis} puts them at ${fmt(at)}, within ${fmt(lower)}..${fmt(upper)}${n === min ? " or at replicas.min" : ""}`,
  };
}

/** Stage 3: a model's count over its profiles, each from its min up to its max, in config order. */
export function spread(m: CatalogModel, total: number): Map<string, number> {
  const out = new Map<string, number>();
  let extra = total - m.profiles.reduce((a, p) => a + p.replicas.min, 0);
  for (const p of m.profiles) {
    const add = Math.max(0, Math.min(extra, p.replicas.max - p.replicas.min));
    out.set(p.key, p.replicas.min + add);
    extra -= add;
  }
  return out;
}

/**
 * Stage 2. The fleet as it will be once everything retiring has stopped,
 * without `victims`: does every missing replica of `profiles` fit?
 */
function fits(
  input: ScaleInput,
  missing: readonly { prof: CatalogProfile; count: number }[],
  victims: ReadonlySet<string>,
): boolean {
  const fleet = new Fleet(input.nodes, input.portRange);
  const lost = new Set(input.nodes.filter((n) => n.state === "lost").map((n) => n.name));
  for (const r of input.replicas) {
    if (r.retire || victims.has(r.id)) continue;
    for (const s of r.shards)
      if (!isDead(s.state) && !lost.has(s.node))
        fleet.hold(s.node, `${r.model}/${r.profile}`, s.gpus, [s.ports.http, ...s.ports.distInit]);
  }
  for (const { prof, count } of missing) {
    for (let i = 0; i < count; i++) {
      const placed = placeReplica(fleet, prof, { replicaId: `${prof.key}/scaling-${i}` });
      if (!placed.ok) return false;
      fleet.reserve(prof.key, placed.assignment);
    }
  }
  return true;
}

/** The replica `plan` would drain first from a profile over its count: not ready, then highest index. */
function drainOrder(records: readonly ReplicaRecord[]): ReplicaRecord[] {
  return [...records].sort((a, b) => Number(ready(a)) - Number(ready(b)) || b.index - a.index);
}

interface Want {
  m: CatalogModel;
  total: number;
  byProfile: Map<string, number>;
  why: string;
}

function yieldToPriority(input: ScaleInput, wants: Map<string, Want>): void {
  const byModel = (model: string) => input.replicas.filter((r) => r.model === model && live(r));
  const order = [...wants.values()].sort((a, b) => b.m.priority - a.m.priority);
  for (const w of order) {
    const missing = w.m.profiles.flatMap((prof) => {
      const count =
        (w.byProfile.get(prof.key) ?? 0) - byModel(w.m.name).filter((r) => r.profile === prof.name).length;
      return count > 0 ? [{ prof, count }] : [];
    });
    if (missing.length === 0 || fits(input, missing, new Set())) continue;
    const victims = new Set<string>();
    const taken: { v: Want; key: string }[] = [];
    const lower = order.filter((v) => v.m.priority < w.m.priority).reverse();
    let ok = false;
    for (const v of lower) {
      for (const prof of [...v.m.profiles].reverse()) {
        const running = drainOrder(
          byModel(v.m.name).filter((r) => r.profile === prof.name && !victims.has(r.id)),
        );
        while (
          !ok &&
          running.length > 0 &&
          (v.byProfile.get(prof.key) ?? 0) - countOf(taken, v, prof.key) > prof.replicas.min
        ) {
          victims.add(running.shift()!.id);
          taken.push({ v, key: prof.key });
          ok = fits(input, missing, victims);
        }
      }
      if (ok) break;
    }
    if (!ok) continue;
    for (const { v, key } of taken) {
      v.byProfile.set(key, (v.byProfile.get(key) ?? 0) - 1);
      v.total--;
      v.why = `gives a replica to ${w.m.name} (priority ${w.m.priority} over ${v.m.priority}): GPUs are short`;
    }
  }
}

const countOf = (taken: readonly { v: Want; key: string }[], v: Want, key: string) =>
  taken.filter((t) => t.v === v && t.key === key).length;

export function scale(input: ScaleInput, now: number): ScaleOutcome {
  const wants = new Map<string, Want>();
  const models = new Map<string, ModelScale>();
  for (const m of input.catalog.models) {
    if (m.routerOnly) continue;
    const min = m.profiles.reduce((a, p) => a + p.replicas.min, 0);
    const max = m.profiles.reduce((a, p) => a + p.replicas.max, 0);
    const mem = input.memory.get(m.name);
    const sig = input.signals.get(m.name);
    const loadMs = loadTimeMs(m.name, input.replicas);
    const v = verdict(m, { min, max }, mem?.desired ?? min, sig?.signal, loadMs, mem?.last, now);
    wants.set(m.name, { m, total: v.want, byProfile: spread(m, v.want), why: v.why });
    models.set(m.name, {
      model: m.name,
      min,
      max,
      desired: v.want,
      ready: input.replicas.filter((r) => r.model === m.name && ready(r)).length,
      loadMs,
      signal: sig?.signal,
      sources: sig?.sources ?? ["no sample yet"],
      why: v.why,
      ...(mem?.last ? { last: mem.last } : {}),
    });
  }
  yieldToPriority(input, wants);

  const desired = new Map<string, number>();
  const memory = new Map<string, ScaleMemory>();
  const events: ScaleEvent[] = [];
  for (const w of wants.values()) {
    for (const [k, n] of w.byProfile) desired.set(k, n);
    const ms = models.get(w.m.name)!;
    const mem = input.memory.get(w.m.name);
    const from = Math.min(ms.max, Math.max(ms.min, mem?.desired ?? ms.min));
    ms.desired = w.total;
    ms.why = w.why;
    let last = mem?.last;
    if (w.total !== from) {
      last = { model: w.m.name, at: now, from, to: w.total, why: w.why };
      events.push(last);
      ms.last = last;
    }
    memory.set(w.m.name, { desired: w.total, ...(last ? { last } : {}) });
  }
  return { models, desired, memory, events };
}
