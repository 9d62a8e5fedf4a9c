/**
 * One reconcile pass: desired state (the catalog's replicas per profile)
 * against actual state (the replica table and the node snapshot), answered
 * with a list of actions. Pure: `plan(state, now)` reads nothing else and
 * changes nothing; the caller sends the commands and feeds the actions back
 * into the ReplicaTable (table.ts).
 *
 * Rules, in the order a pass applies them to each replica:
 * 1. shards of older generations still running are stopped — unless they
 *    are a whole replica back from a lost node and serving while its
 *    replacement still starts: then they are reinstated and the replacement
 *    stops; shards on lost nodes are released (only `lost` frees GPUs;
 *    `unreachable` keeps them — a network blip must not tear down a replica
 *    that may still serve);
 * 2. a replica is a gang: if any rank failed or sits on a lost node, every
 *    rank is stopped and the replica waits to be placed again. Failures that
 *    are the model's (exit, startup deadline) grow the model's exponential
 *    backoff (base_backoff doubling to max_backoff); a lost node does not;
 * 3. replicas agents reported at registration are adopted, not restarted,
 *    unless their world size is not the profile's (those are stopped); one
 *    that runs an older spec is left to the rollout; multi-node ones with
 *    ranks missing are held for the adoption grace first;
 * 4. per profile: replicas running an older spec are replaced a few at a
 *    time, make before break (rollout.ts); surplus replicas are stopped
 *    (not-ready and highest index first), or drained when the scaling stage
 *    (scale.ts) asked for fewer within replicas.max; replicas on draining
 *    nodes are replaced elsewhere first and drained once enough replacements
 *    are ready (or at the drain deadline); missing replicas are placed,
 *    biggest profiles first so large gangs find whole nodes before small
 *    replicas fragment them.
 */
import { doublingDelay } from "../../common/backoff.ts";
import type { Catalog, CatalogProfile } from "../catalog.ts";
import { Fleet } from "../placement/fleet.ts";
import { PlacementSession, placeReplica } from "../placement/pipeline.ts";
import type { Assignment, Explanation, PlacementNode } from "../placement/types.ts";
import { replicaId } from "./ids.ts";
import { drainable, type Outdated, outdatedWhy, splitOutdated } from "./rollout.ts";
import { sameWorld, specMismatch, specOf } from "./spec.ts";
import type {
  Action,
  Failure,
  ModelBackoff,
  PlanSettings,
  PlanState,
  ReplicaRecord,
  ShardRecord,
  ShardRef,
} from "./types.ts";
import { isDead } from "./types.ts";

export interface PlanOptions {
  /**
   * Attach a full placement explanation to every waiting replica, including
   * those in backoff (a dry run that reserves nothing). `ctl explain` wants
   * it; the periodic pass does not need to pay for it.
   */
  explainAll?: boolean;
}

const ref = (s: ShardRecord): ShardRef => ({ node: s.node, rank: s.rank });

/** The backoff a model has after one more failure. */
export function backoffAfter(
  prev: ModelBackoff | undefined,
  failure: Failure,
  now: number,
  settings: Pick<PlanSettings, "baseBackoffMs" | "maxBackoffMs">,
): ModelBackoff {
  const failures = (prev?.failures ?? 0) + 1;
  return {
    failures,
    retryAt: now + doublingDelay(failures, settings.baseBackoffMs, settings.maxBackoffMs),
    lastFailure: failure,
  };
}

class Pass {
  readonly actions: Action[] = [];

  /** Stops every live shard of `r` and lets the replica slot go. */
  private retire(r: ReplicaRecord, reason: string): void {
    this.actions.push({
      kind: "stop",
      replicaId: r.id,
      shards: r.shards.filter((s) => !isDead(s.state)).map(ref),
      mode: "stop",
      retire: true,
      reason,
    });
  }
  private drainAway(r: ReplicaRecord, reason: string): void {
    this.actions.push({
      kind: "stop",
      replicaId: r.id,
      shards: r.shards.filter((s) => !isDead(s.state)).map(ref),
      mode: "drain",
      retire: true,
      reason,
    });
  }
  private fleetView: Fleet | undefined;
  private readonly nodes = new Map<string, PlacementNode>();
  private readonly backoff: Map<string, ModelBackoff>;
  private readonly bumped = new Set<string>();
  private readonly unplaceable = new Map<string, Explanation>();
  /** One per profile: profiles are reconciled one after another, so a session never sees stale nodes. */
  private readonly sessions = new Map<string, PlacementSession>();

  constructor(
    private readonly state: PlanState,
    private readonly now: number,
    private readonly opts: PlanOptions,
  ) {
    for (const n of state.nodes) this.nodes.set(n.name, n);
    this.backoff = new Map(state.backoff);
  }

  /**
   * The working view of the fleet, built on the first placement of the pass:
   * a steady-state pass places nothing and so never pays for it. Building it
   * late sees the same holds as building it early, because the plan never
   * changes the records it reads.
   */
  private get fleet(): Fleet {
    if (this.fleetView) return this.fleetView;
    const fleet = new Fleet(this.state.nodes, this.state.settings.portRange);
    for (const r of this.state.replicas) {
      const key = `${r.model}/${r.profile}`;
      for (const s of r.shards) this.hold(fleet, key, s);
      for (const s of r.retiring) this.hold(fleet, key, s);
    }
    this.fleetView = fleet;
    return fleet;
  }

  private hold(fleet: Fleet, key: string, s: ShardRecord): void {
    if (isDead(s.state) || this.lost(s.node)) return;
    fleet.hold(s.node, key, s.gpus, [s.ports.http, ...s.ports.distInit]);
  }

  lost(node: string): boolean {
    return this.nodes.get(node)?.state === "lost";
  }

  draining(node: string): PlacementNode | undefined {
    const n = this.nodes.get(node);
    return n?.draining ? n : undefined;
  }

  /** Settles one record; says whether it still holds a live generation. */
  settle(r: ReplicaRecord, prof: CatalogProfile | undefined): "live" | "pending" | "gone" {
    const release: ShardRef[] = [];
    const strays: ShardRecord[] = [];
    for (const s of r.retiring) {
      if (this.lost(s.node)) release.push(ref(s));
      else if (s.state !== "stopping" && !isDead(s.state)) strays.push(s);
    }
    if (release.length > 0) {
      this.actions.push({ kind: "release", replicaId: r.id, shards: release, reason: "node lost" });
    }
    if (prof && !r.retire && this.reinstate(r, strays, prof)) return "live";
    if (strays.length > 0) {
      this.actions.push({
        kind: "stop",
        replicaId: r.id,
        shards: strays.map(ref),
        mode: "stop",
        retire: false,
        reason: "shard of an older generation is still running",
      });
    }
    if (r.retire) return "gone";

    if (!prof) {
      const live = r.shards.filter((s) => !isDead(s.state) && !this.lost(s.node));
      if (live.length > 0) {
        this.actions.push({
          kind: "stop",
          replicaId: r.id,
          shards: live.map(ref),
          mode: "stop",
          retire: true,
          reason: `profile ${r.model}/${r.profile} is not in the catalog`,
        });
      } else this.actions.push({ kind: "forget", replicaId: r.id, reason: "profile is not in the catalog" });
      return "gone";
    }
    if (r.shards.length === 0) return "pending";

    const onLost = r.shards.filter((s) => this.lost(s.node));
    if (onLost.length > 0) {
      this.restart(r, {
        reason: `node ${onLost.map((s) => s.node).join(", ")} lost`,
        at: this.now,
        countsForBackoff: false,
      });
      return "pending";
    }
    const failed = r.shards.find((s) => s.state === "failed_startup" || s.state === "failed_running");
    if (failed) {
      this.restart(
        r,
        failed.failure ?? {
          reason: `rank ${failed.rank} on ${failed.node}: ${failed.state.replace("_", " ")}`,
          at: this.now,
          countsForBackoff: true,
        },
      );
      return "pending";
    }
    const silent = r.shards.find(
      (s) => s.state === "assigned" && this.now - s.since > prof.startupDeadlineMs,
    );
    if (silent) {
      this.restart(r, {
        reason: `rank ${silent.rank} on ${silent.node}: no status within the startup deadline`,
        at: this.now,
        countsForBackoff: true,
      });
      return "pending";
    }

    return r.origin === "reported" && !r.adopted ? this.adopt(r, prof) : "live";
  }

  /** A replica an agent reported and nobody placed: kept, held for its missing ranks, or stopped. */
  private adopt(r: ReplicaRecord, prof: CatalogProfile): "live" | "pending" | "gone" {
    const mismatch = specMismatch(r.spec, prof);
    if (!sameWorld(r.spec, prof)) {
      this.retire(r, `reported replica does not match ${prof.key}: ${mismatch}`);
      return "gone";
    }
    if (r.shards.length < prof.nodes) {
      if (this.now < (r.reportedAt ?? this.now) + this.state.settings.adoptionGraceMs) return "live";
      this.restart(r, {
        reason: `only ${r.shards.length} of ${prof.nodes} ranks reported within the adoption grace`,
        at: this.now,
        countsForBackoff: false,
      });
      return "pending";
    }
    this.actions.push({
      kind: "adopt",
      replicaId: r.id,
      generation: r.generation,
      reason: `running ${r.shards.map((s) => `rank ${s.rank} on ${s.node}`).join(", ")} ${
        mismatch
          ? `serves ${prof.key} with an older spec (${mismatch}): the rollout replaces it`
          : `matches ${prof.key}`
      }`,
    });
    return "live";
  }

  /**
   * A replica whose node was lost comes back serving while the replacement
   * placed meanwhile still loads: the operator wants the one that serves,
   * and no GPU loading a copy nobody needs. Every rank of the returning
   * generation must be ready and none of the replacement's; otherwise the
   * replacement is kept and the returning shards stop as strays, so at no
   * moment are both stopped, and a second copy lives only until one of the
   * two is ready.
   */
  private reinstate(r: ReplicaRecord, strays: readonly ShardRecord[], prof: CatalogProfile): boolean {
    const generation = strays[0]?.generation;
    if (generation === undefined || generation === r.generation) return false;
    const ranks = new Set(strays.map((s) => s.rank));
    const whole =
      strays.length === prof.nodes &&
      ranks.size === prof.nodes &&
      strays.every((s) => s.generation === generation && s.state === "ready");
    if (!whole) return false;
    if (r.shards.some((s) => s.state === "ready")) return false;
    const returning = new Set(strays.map((s) => s.node));
    if (r.shards.some((s) => returning.has(s.node))) return false;
    if (!strays.every((s) => sameWorld(s.spec, prof))) return false;
    this.actions.push({
      kind: "reinstate",
      replicaId: r.id,
      generation,
      shards: strays.map(ref),
      stop: r.shards.filter((s) => !isDead(s.state)).map(ref),
      reason: `generation ${generation} on ${[...returning].join(", ")} is back and serving; the replacement (generation ${r.generation}) is not ready yet`,
    });
    return true;
  }

  private restart(r: ReplicaRecord, failure: Failure): void {
    let backoff: ModelBackoff | undefined;
    if (failure.countsForBackoff) {
      backoff = this.backoff.get(r.model);
      if (!this.bumped.has(r.model)) {
        // Several replicas of a model failing in one pass share a cause more
        // often than not: grow the backoff once per pass, not once per replica.
        backoff = backoffAfter(backoff, failure, this.now, this.state.settings);
        this.backoff.set(r.model, backoff);
        this.bumped.add(r.model);
      }
    }
    this.actions.push({
      kind: "restart",
      replicaId: r.id,
      model: r.model,
      stop: r.shards.filter((s) => !isDead(s.state) && !this.lost(s.node)).map(ref),
      release: r.shards.filter((s) => this.lost(s.node)).map(ref),
      failure,
      ...(backoff ? { backoff } : {}),
      reason: `gang restart: ${failure.reason}`,
    });
  }

  /** Surplus, drains, the rollout and placement for one profile. */
  reconcileProfile(prof: CatalogProfile, records: ReplicaRecord[]): void {
    const live: ReplicaRecord[] = [];
    const pending: ReplicaRecord[] = [];
    for (const r of records) {
      const s = this.settle(r, prof);
      if (s === "live") live.push(r);
      else if (s === "pending") pending.push(r);
    }
    const desired = this.state.desired?.get(prof.key) ?? prof.replicas.min;
    const leaving: ReplicaRecord[] = [];
    let staying: ReplicaRecord[] = [];
    for (const r of live) (r.shards.some((s) => this.draining(s.node)) ? leaving : staying).push(r);

    const roll = splitOutdated(staying, prof, ready, this.state.retiredKeys);
    for (const o of roll.restart) this.retire(o.replica, `rollout: not serving yet and ${o.why}`);
    staying = this.dropSurplus(prof, roll.staying, desired);
    const readyStaying = staying.filter(ready).length;
    this.drainLeavingNodes(leaving, readyStaying, desired);
    const drained = drainable(roll.leaving, readyStaying, desired, prof.rollout);
    for (const o of drained) this.drainAway(o.replica, `rollout: ${o.why}; enough replicas serve without it`);
    // Replacements for the replicas in their turn, but never more than
    // max_surge beyond the wanted count while the ones they replace still run.
    const stillRunning = roll.leaving.length - drained.length;
    const surge = prof.rollout.paused ? 0 : prof.rollout.maxSurge;
    const need = Math.min(desired - staying.length, desired + surge - staying.length - stillRunning);
    this.placeMissing(prof, records, pending, need, desired, roll.leaving);
  }

  /**
   * Replicas beyond the wanted count: outdated and not ready ones first, then
   * the highest index. Returns the ones that stay.
   */
  private dropSurplus(prof: CatalogProfile, staying: ReplicaRecord[], desired: number): ReplicaRecord[] {
    if (staying.length <= desired) return staying;
    const outdated = (r: ReplicaRecord) => outdatedWhy(r, prof, this.state.retiredKeys) !== undefined;
    const order = [...staying].sort(
      (a, b) =>
        Number(outdated(b)) - Number(outdated(a)) || Number(ready(a)) - Number(ready(b)) || b.index - a.index,
    );
    const surplus = order.slice(0, staying.length - desired);
    // Replicas beyond replicas.max are a configuration change and stop as
    // before; a scale-down within the range drains a serving replica, so
    // the edge stops sending to it and no request is cut.
    const overMax = Math.max(0, staying.length - prof.replicas.max);
    surplus.forEach((r, i) => {
      const why = `${prof.key} wants ${desired} replica(s), ${staying.length} running`;
      if (i < overMax || !ready(r) || this.state.desired === undefined) this.retire(r, `surplus: ${why}`);
      else this.drainAway(r, `scale down: ${why}`);
    });
    return staying.filter((r) => !surplus.includes(r));
  }

  /** Replicas on draining nodes go once enough replacements serve, or at the node's deadline. */
  private drainLeavingNodes(leaving: ReplicaRecord[], readyStaying: number, desired: number): void {
    for (const r of leaving.sort((a, b) => a.index - b.index)) {
      const nodes = [...new Set(r.shards.map((s) => s.node).filter((n) => this.draining(n)))];
      const deadline = Math.min(
        ...nodes.map((n) => this.draining(n)?.drainDeadline ?? Number.POSITIVE_INFINITY),
      );
      if (readyStaying >= desired) {
        this.drainAway(
          r,
          `node ${nodes.join(", ")} draining; ${readyStaying} replacement(s) ready elsewhere`,
        );
      } else if (this.now >= deadline) {
        this.retire(r, `drain deadline of ${nodes.join(", ")} passed without a ready replacement`);
      }
    }
  }

  /** Places `need` replicas (pending slots first, then the lowest free index) and forgets pending slots beyond it. */
  private placeMissing(
    prof: CatalogProfile,
    records: readonly ReplicaRecord[],
    pending: ReplicaRecord[],
    need: number,
    desired: number,
    rolling: readonly Outdated[],
  ): void {
    pending.sort((a, b) => a.index - b.index);
    const used = new Set(records.map((r) => r.index));
    const purpose =
      rolling.length > 0
        ? `rollout: replacing ${rolling.map((o) => o.replica.id).join(", ")} (${rolling[0]!.why})`
        : undefined;
    let next = 0;
    for (let i = 0; i < need; i++) {
      const r: ReplicaRecord | undefined = pending[i];
      let id: string;
      if (r) id = r.id;
      else {
        while (used.has(next)) next++;
        used.add(next);
        id = replicaId(prof.model, prof.name, next);
      }
      this.tryPlace(prof, id, r, purpose);
    }
    for (const r of pending.slice(Math.max(0, need))) {
      this.actions.push({
        kind: "forget",
        replicaId: r.id,
        reason: `not needed: ${prof.key} wants ${desired} replica(s)`,
      });
    }
  }

  /** `purpose`, when the placement is a rollout's replacement: said in its reason, and in a wait's. */
  private tryPlace(prof: CatalogProfile, id: string, r: ReplicaRecord | undefined, purpose?: string): void {
    const b = this.backoff.get(prof.model);
    const base = { kind: "wait" as const, replicaId: id, model: prof.model, profile: prof.name };
    if (b && b.retryAt > this.now) {
      const explanation = this.opts.explainAll
        ? placeReplica(this.fleet, prof, { replicaId: id, explain: true }).explanation
        : undefined;
      const reason = `backoff after ${b.failures} failure(s) of ${prof.model}${b.lastFailure ? ` (${b.lastFailure.reason})` : ""}`;
      if (explanation) explanation.note = `${reason}; retry at ${new Date(b.retryAt).toISOString()}`;
      this.actions.push({ ...base, reason, until: b.retryAt, ...(explanation ? { explanation } : {}) });
      return;
    }
    const hold = this.state.settings.placeAfter;
    if (hold !== undefined && this.now < hold) {
      this.actions.push({
        ...base,
        reason: "control plane started recently: waiting for agents to re-register before placing",
        until: hold,
      });
      return;
    }
    const known = this.unplaceable.get(prof.key);
    if (known) {
      const reason = withPurpose(headline(known), purpose);
      this.actions.push({
        ...base,
        reason,
        explanation: { ...known, replicaId: id, ...noted(purpose, reason) },
      });
      return;
    }
    let assignment: Assignment | undefined;
    if (this.opts.explainAll) {
      const result = placeReplica(this.fleet, prof, { replicaId: id, explain: true });
      if (result.ok) {
        this.fleet.reserve(prof.key, result.assignment);
        assignment = result.assignment;
      }
    } else {
      let session = this.sessions.get(prof.key);
      if (!session) {
        session = new PlacementSession(this.fleet, prof);
        this.sessions.set(prof.key, session);
      }
      assignment = session.place(id);
    }
    if (!assignment) {
      const { explanation } = placeReplica(this.fleet, prof, { replicaId: id, explain: true });
      this.unplaceable.set(prof.key, explanation);
      const reason = withPurpose(headline(explanation), purpose);
      this.actions.push({ ...base, reason, explanation: { ...explanation, ...noted(purpose, reason) } });
      return;
    }
    this.actions.push({
      kind: "place",
      replicaId: id,
      model: prof.model,
      profile: prof.name,
      generation: (r?.generation ?? 0) + 1,
      assignment,
      spec: specOf(prof),
      reason: r?.lastFailure ? `replacing after: ${r.lastFailure.reason}` : (purpose ?? "missing replica"),
    });
  }
}

const ready = (r: ReplicaRecord): boolean =>
  r.shards.length > 0 && r.shards.every((s) => s.state === "ready");

/**
 * A rollout that cannot place its replacement keeps every replica it would
 * replace serving; the wait says so, and what would let it go on.
 */
function withPurpose(reason: string, purpose: string | undefined): string {
  if (!purpose) return reason;
  return `${reason}; ${purpose} waits for room for one more replica, or for rollout.max_unavailable above 0`;
}

/** A rollout's wait says so in `ctl explain` too. */
function noted(purpose: string | undefined, reason: string): Pick<Explanation, "note"> {
  return purpose ? { note: reason.slice(reason.indexOf(purpose)) } : {};
}

function headline(e: Explanation): string {
  return `${e.nodesFeasible}/${e.nodesTotal} nodes can host ${e.target}: ${e.rejected.map((r) => r.message).join(", ")}`;
}

/**
 * Profiles in placement order: higher model priority first (the scaling
 * stage counted on it taking the GPUs a lower model gave up), then largest
 * replicas, then config order.
 */
function placementOrder(catalog: Catalog): CatalogProfile[] {
  const all = catalog.profiles();
  const pos = new Map(all.map((p, i) => [p.key, i]));
  const prio = (p: CatalogProfile) => catalog.get(p.model)?.priority ?? 0;
  return all.sort(
    (a, b) => prio(b) - prio(a) || b.gpusPerReplica - a.gpusPerReplica || pos.get(a.key)! - pos.get(b.key)!,
  );
}

export function plan(state: PlanState, now: number, opts: PlanOptions = {}): Action[] {
  const pass = new Pass(state, now, opts);
  const byProfile = new Map<string, ReplicaRecord[]>();
  for (const r of state.replicas) {
    const key = `${r.model}/${r.profile}`;
    let list = byProfile.get(key);
    if (!list) {
      list = [];
      byProfile.set(key, list);
    }
    list.push(r);
  }
  for (const prof of placementOrder(state.catalog)) {
    pass.reconcileProfile(prof, byProfile.get(prof.key) ?? []);
    byProfile.delete(prof.key);
  }
  // Whatever is left belongs to no profile in the catalog (removed, renamed).
  for (const records of byProfile.values()) for (const r of records) pass.settle(r, undefined);
  return pass.actions;
}

/**
 * PlanSettings from the control section of the config. With `startedAt`
 * (the control plane's start), new placements are held for the startup
 * grace so running replicas can be adopted first.
 */
export function planSettings(
  control: {
    port_range: readonly [number, number] | number[];
    base_backoff: number;
    max_backoff: number;
    lost_after: number;
    startup_grace?: number | undefined;
  },
  startedAt?: number,
): PlanSettings {
  const grace = control.startup_grace ?? control.lost_after;
  return {
    portRange: { first: control.port_range[0]!, last: control.port_range[1]! },
    baseBackoffMs: control.base_backoff,
    maxBackoffMs: control.max_backoff,
    adoptionGraceMs: grace,
    ...(startedAt !== undefined ? { placeAfter: startedAt + grace } : {}),
  };
}
