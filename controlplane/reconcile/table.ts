/**
 * The replica table: the control plane's memory of what it placed and what
 * agents report, plus per-model backoff. It is the only mutable state the
 * reconciler has, and it changes in exactly two ways: `apply(actions)` after
 * the caller has sent the commands a plan asked for, and `observe*` when an
 * agent reports — besides `restore` at a control plane's start. After a
 * restart the table is rebuilt from agent registrations (adoption), seeded
 * with the replicas of nodes the last control plane knew (known-fleet.ts)
 * so that a late agent's replicas are awaited, not placed again.
 *
 * Wiring, for the control plane: on every tick or event
 *   const actions = plan(table.planState(catalog, nodes, settings), now);
 *   send(actions); table.apply(actions, now);
 * and on the stream: `observeRegistration` for Register, `observe` for ShardStatus.
 */
import type { Catalog } from "../catalog.ts";
import type { PlacementNode } from "../placement/types.ts";
import { parseReplicaId } from "./ids.ts";
import type { KnownReplica } from "./known-fleet.ts";
import type {
  Action,
  Failure,
  ModelBackoff,
  ObservedShard,
  PlanSettings,
  PlanState,
  ReplicaRecord,
  ShardRecord,
  ShardRef,
  TrackedState,
} from "./types.ts";
import { isDead } from "./types.ts";

export type ReplicaStatus = "pending" | "backoff" | "starting" | "ready" | "draining" | "failed" | "stopping";

export class ReplicaTable {
  private readonly records = new Map<string, ReplicaRecord>();
  readonly backoff = new Map<string, ModelBackoff>();

  get(id: string): ReplicaRecord | undefined {
    return this.records.get(id);
  }

  list(): ReplicaRecord[] {
    return [...this.records.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  get size(): number {
    return this.records.size;
  }

  /** Everything `plan` needs, from this table plus the caller's catalog and node snapshot. */
  planState(catalog: Catalog, nodes: readonly PlacementNode[], settings: PlanSettings): PlanState {
    return { catalog, nodes, replicas: [...this.records.values()], backoff: this.backoff, settings };
  }

  apply(actions: readonly Action[], now: number): void {
    for (const a of actions) this.applyOne(a, now);
  }

  private applyOne(a: Action, now: number): void {
    const r = this.records.get(a.replicaId);
    switch (a.kind) {
      case "place": {
        const rec = r ?? this.create(a.replicaId);
        rec.generation = a.generation;
        rec.shards = a.assignment.shards.map((s) => ({
          rank: s.rank,
          node: s.node,
          gpus: [...s.gpus],
          ports: { http: s.ports.http, distInit: [...s.ports.distInit] },
          state: "assigned" as const,
          since: now,
        }));
        rec.worldNodes = rec.shards.length;
        rec.origin = "placed";
        rec.adopted = true;
        rec.retire = false;
        rec.placedAt = now;
        rec.spec = a.spec;
        rec.placement = {
          score: a.assignment.score,
          why: a.assignment.why,
          ...(a.assignment.fabric ? { fabric: a.assignment.fabric } : {}),
        };
        delete rec.waiting;
        return;
      }
      case "stop": {
        if (!r) return;
        for (const x of a.shards) this.retireShard(r, x, now);
        if (a.retire) {
          r.retire = true;
          for (const s of r.shards)
            if (!isDead(s.state)) r.retiring.push({ ...s, state: "stopping", since: now });
          r.shards = [];
        }
        this.dropIfDone(r);
        return;
      }
      case "restart": {
        if (!r) return;
        for (const x of a.stop) this.retireShard(r, x, now);
        for (const x of a.release) this.dropShard(r, x);
        r.shards = [];
        r.restarts++;
        r.lastFailure = a.failure;
        r.origin = "placed";
        r.adopted = true;
        if (a.backoff) this.backoff.set(a.model, a.backoff);
        return;
      }
      case "release": {
        if (!r) return;
        for (const x of a.shards) this.dropShard(r, x);
        this.dropIfDone(r);
        return;
      }
      case "reinstate": {
        if (!r) return;
        for (const x of a.stop) this.retireShard(r, x, now);
        const back = r.retiring.filter((s) => a.shards.some((x) => x.node === s.node && x.rank === s.rank));
        r.retiring = r.retiring.filter((s) => !back.includes(s));
        r.shards = back.map(({ generation: _g, spec: _s, ...s }) => s);
        // It runs what it was launched with, not what its replacement was.
        if (back[0]?.spec) r.spec = back[0].spec;
        r.generation = a.generation;
        r.worldNodes = back.length;
        r.origin = "placed";
        r.adopted = true;
        delete r.waiting;
        return;
      }
      case "adopt":
        if (r) r.adopted = true;
        return;
      case "forget":
        this.records.delete(a.replicaId);
        return;
      case "wait": {
        const rec = r ?? this.create(a.replicaId);
        rec.waiting = {
          reason: a.reason,
          ...(a.until !== undefined ? { until: a.until } : {}),
          ...(a.explanation ? { explanation: a.explanation } : {}),
        };
      }
    }
  }

  /**
   * Replicas the last control plane had (known-fleet.ts), taken back as its
   * own placements: live, so nothing is placed in their stead, and claimed
   * like any placement when their agents register. Ids the table already
   * holds are left alone.
   */
  restore(replicas: readonly KnownReplica[], now: number): void {
    for (const k of replicas) {
      if (this.records.has(k.id)) continue;
      const r = this.create(k.id);
      r.generation = k.generation;
      r.worldNodes = k.worldNodes;
      r.shards = k.shards.map((s) => ({
        rank: s.rank,
        node: s.node,
        gpus: [...s.gpus],
        ports: { http: s.ports.http, distInit: [...s.ports.distInit] },
        state: s.state,
        since: now,
        unconfirmed: true,
      }));
    }
  }

  /** A status report for one shard (ShardStatus on the stream). */
  observe(node: string, o: ObservedShard, now: number): void {
    const r = this.records.get(o.replicaId);
    if (!r) {
      if (!isDead(o.state)) this.adoptCandidate(node, o, now);
      return;
    }
    const sameGen = o.generation === undefined || o.generation === r.generation;
    const cur = sameGen ? r.shards.find((s) => s.rank === o.rank && s.node === node) : undefined;
    if (cur) {
      this.update(r, cur, o, now, false);
      // The agent's word over the placement's: it is what the engine runs.
      if (o.spec) r.spec = o.spec;
      if (r.shards.length > 0 && r.shards.every((s) => s.state === "ready")) {
        // The model demonstrably works: its next failure starts from base_backoff.
        this.backoff.delete(r.model);
        delete r.waiting;
      }
      return;
    }
    const old = r.retiring.find((s) => s.rank === o.rank && s.node === node);
    if (old) {
      if (isDead(o.state)) r.retiring.splice(r.retiring.indexOf(old), 1);
      else if (old.state !== "stopping") this.update(r, old, o, now, true);
      this.dropIfDone(r);
      return;
    }
    if (isDead(o.state)) return;
    const shard = this.shardFrom(node, o, now);
    // A slot with nothing placed takes over whatever generation runs instead
    // of stopping it: the first pass after a control plane restart ran before
    // this agent re-registered, or its node was lost and came back before a
    // replacement could be placed. Nothing newer serves, so stopping it would
    // only leave the slot empty. (Without a generation on the wire only a
    // slot that never had one can tell.)
    const takesOver = o.generation !== undefined || r.generation === 0;
    if (r.shards.length === 0 && !r.retire && takesOver) {
      this.becomeReported(r, node, o, now);
      return;
    }
    if (sameGen && r.origin === "reported" && !r.adopted) r.shards.push(shard);
    // Unknown or another generation: the plan stops it, or reinstates it over a
    // replacement that does not serve yet.
    else
      r.retiring.push({
        ...shard,
        ...(o.generation !== undefined ? { generation: o.generation } : {}),
        ...(o.spec ? { spec: o.spec } : {}),
      });
  }

  /**
   * A (re-)registration carries every shard the agent runs. Shards we
   * believed were on the node but it does not list are gone: a live one has
   * failed; one still `assigned` never reached the agent, which is not the
   * model's fault and does not grow its backoff.
   */
  observeRegistration(node: string, shards: readonly ObservedShard[], now: number): void {
    const listed = new Set(shards.map((o) => `${o.replicaId}#${o.rank}`));
    for (const r of this.records.values()) {
      const denied = r.shards.find(
        (s) => s.node === node && s.unconfirmed && !listed.has(`${r.id}#${s.rank}`),
      );
      if (denied && r.shards.length === 1) {
        // Only the kept fleet said it ran there (its engine was stopped on
        // purpose, or died, while no control plane watched): nothing failed
        // that this one saw, so the slot is simply empty again.
        r.shards = [];
        continue;
      }
      for (const s of r.shards) {
        if (s.node !== node || isDead(s.state) || listed.has(`${r.id}#${s.rank}`)) continue;
        const failure: Failure =
          s.state === "assigned"
            ? { reason: `start of rank ${s.rank} never reached ${node}`, at: now, countsForBackoff: false }
            : {
                reason: `${node} re-registered without rank ${s.rank}`,
                at: now,
                countsForBackoff: !s.unconfirmed,
              };
        s.state = s.state === "assigned" ? "failed_startup" : "failed_running";
        s.since = now;
        s.failure = failure;
      }
      r.retiring = r.retiring.filter((s) => s.node !== node || listed.has(`${r.id}#${s.rank}`));
    }
    for (const o of shards) this.observe(node, o, now);
    for (const r of [...this.records.values()]) this.dropIfDone(r);
  }

  private update(r: ReplicaRecord, s: ShardRecord, o: ObservedShard, now: number, retiring: boolean): void {
    let state: TrackedState = o.state;
    let failure: Failure | undefined;
    if (o.failure || state === "failed_startup" || state === "failed_running") {
      failure = {
        reason: o.failure?.reason ?? `rank ${s.rank} on ${s.node}: ${state.replace("_", " ")}`,
        ...(o.failure?.exitCode !== undefined ? { exitCode: o.failure.exitCode } : {}),
        ...(o.failure?.outputTail ? { outputTail: o.failure.outputTail } : {}),
        at: o.failure?.at ?? now,
        countsForBackoff: true,
      };
    }
    if (state === "stopped" && !retiring && s.state !== "stopping") {
      // Nobody asked it to stop: for the gang that is a failure.
      state = "failed_running";
      failure ??= {
        reason: `rank ${s.rank} on ${s.node} stopped unexpectedly`,
        at: now,
        countsForBackoff: true,
      };
    }
    if (state !== s.state) s.since = now;
    s.state = state;
    delete s.unconfirmed;
    if (failure) {
      s.failure = failure;
      r.lastFailure = failure;
    }
    if (o.gpus) s.gpus = [...o.gpus];
    if (o.ports) s.ports = { http: o.ports.http, distInit: [...o.ports.distInit] };
  }

  private adoptCandidate(node: string, o: ObservedShard, now: number): void {
    const key = parseReplicaId(o.replicaId);
    const r = this.create(o.replicaId, key ?? { model: o.replicaId, profile: "", index: 0 });
    this.becomeReported(r, node, o, now);
  }

  private becomeReported(r: ReplicaRecord, node: string, o: ObservedShard, now: number): void {
    r.generation = o.generation ?? 1;
    delete r.waiting;
    r.origin = "reported";
    r.adopted = false;
    r.reportedAt = now;
    r.worldNodes = o.worldNodes ?? o.spec?.nodes ?? 1;
    if (o.spec) r.spec = o.spec;
    r.shards.push(this.shardFrom(node, o, now));
  }

  private shardFrom(node: string, o: ObservedShard, now: number): ShardRecord {
    return {
      rank: o.rank,
      node,
      gpus: [...(o.gpus ?? [])],
      ports: o.ports ? { http: o.ports.http, distInit: [...o.ports.distInit] } : { http: 0, distInit: [] },
      state: o.state,
      since: now,
    };
  }

  private create(
    id: string,
    key = parseReplicaId(id) ?? { model: id, profile: "", index: 0 },
  ): ReplicaRecord {
    const r: ReplicaRecord = {
      id,
      model: key.model,
      profile: key.profile,
      index: key.index,
      generation: 0,
      shards: [],
      worldNodes: 0,
      retiring: [],
      retire: false,
      origin: "placed",
      adopted: true,
      restarts: 0,
    };
    this.records.set(id, r);
    return r;
  }

  private retireShard(r: ReplicaRecord, x: ShardRef, now: number): void {
    const i = r.shards.findIndex((s) => s.node === x.node && s.rank === x.rank);
    if (i >= 0) {
      const [s] = r.shards.splice(i, 1);
      if (s && !isDead(s.state)) r.retiring.push({ ...s, state: "stopping", since: now });
      return;
    }
    const old = r.retiring.find((s) => s.node === x.node && s.rank === x.rank);
    if (old) {
      old.state = "stopping";
      old.since = now;
    }
  }

  private dropShard(r: ReplicaRecord, x: ShardRef): void {
    r.shards = r.shards.filter((s) => !(s.node === x.node && s.rank === x.rank));
    r.retiring = r.retiring.filter((s) => !(s.node === x.node && s.rank === x.rank));
  }

  private dropIfDone(r: ReplicaRecord): void {
    if (r.retire && r.retiring.length === 0) this.records.delete(r.id);
    else if (r.origin === "reported" && r.shards.length === 0 && r.retiring.length === 0)
      this.records.delete(r.id);
  }
}

/** One word for `ctl replicas`. */
export function replicaStatus(r: ReplicaRecord, now: number, backoff?: ModelBackoff): ReplicaStatus {
  if (r.retire) return "stopping";
  if (r.shards.length === 0) return backoff && backoff.retryAt > now ? "backoff" : "pending";
  const states = r.shards.map((s) => s.state);
  if (states.some((s) => s === "failed_startup" || s === "failed_running")) return "failed";
  if (states.some((s) => s === "draining" || s === "stopping")) return "draining";
  if (states.every((s) => s === "ready")) return "ready";
  return "starting";
}
