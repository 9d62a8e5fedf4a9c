import { create } from "@bufbuild/protobuf";
import type { Logger } from "../common/log.ts";
import { isFailed, shardStateFromWire } from "../common/shard-state.ts";
import {
  ControlMessageSchema,
  type ShardStatus,
  type StartShard,
  StartShardSchema,
} from "../proto/gen/agent/v1/agent_pb.ts";
import type { AgentStreams } from "./agentsvc/agent-streams.ts";
import type { Catalog, CatalogProfile } from "./catalog.ts";
import type { Config } from "./config/schema.ts";
import type { EngineKeyOf, RetiredKeyTest } from "./engine-keys.ts";
import type { IntentStore } from "./intent-store.ts";
import { placementNode } from "./placement/snapshot.ts";
import type { Assignment, PlacementNode } from "./placement/types.ts";
import { explainModel } from "./reconcile/explain.ts";
import { plan, planSettings } from "./reconcile/plan.ts";
import { type Outdated, outdatedWhy } from "./reconcile/rollout.ts";
import { ReplicaTable } from "./reconcile/table.ts";
import type { Action, ObservedShard, PlanState } from "./reconcile/types.ts";
import type { Registry } from "./registry.ts";
import type { Scaler } from "./scaler.ts";

/**
 * The live shell around the pure planner: it feeds `plan` a snapshot of the
 * registry, operator intent and the replica table, sends the commands the
 * plan asks for through the stream handler (the only holder of the open
 * streams), and records what it did. Runs every `control.interval` and soon
 * after any event that can change the answer.
 */
export interface ReconcilerDeps {
  registry: Registry;
  streams: AgentStreams;
  intents: IntentStore;
  log: Logger;
  now?: () => number;
  /** After every pass, with the table as the pass left it (the known fleet is saved from here). */
  afterPass?: () => void;
  /** Scaling between replicas.min and max; without it every profile keeps min. */
  scaler?: Scaler;
  /** The key a replica's engine is launched to require (controlplane/engine-keys.ts); without it, none. */
  engineKey?: EngineKeyOf;
  /** Whether a launched key derives from a retired secret: its replica is rolled (engine-keys.ts). */
  retiredKey?: RetiredKeyTest;
}

/** A ShardStatus in the planner's words. Undefined for states it cannot use. */
export function observedFrom(s: ShardStatus): ObservedShard | undefined {
  const reported = shardStateFromWire(s.state);
  if (reported === undefined) return undefined;
  const failed = isFailed(reported);
  // The agent restarts single-node shards itself (and keeps doing so while
  // the control plane is away); a gang restart on top would fight it. The
  // failure is still recorded.
  const state = failed && s.restartAtUnixMs > 0n ? "starting" : reported;
  const o: ObservedShard = { replicaId: s.replicaId, rank: s.rank, state };
  if (s.spec) {
    o.generation = Number(s.spec.generation);
    o.gpus = [...s.spec.gpuIndices];
    if (s.spec.ports) o.ports = { http: s.spec.ports.http, distInit: [...s.spec.ports.distInit] };
    o.worldNodes = s.spec.worldNodes || 1;
    o.spec = {
      engine: s.spec.engine,
      source: s.spec.model,
      tensorParallel: s.spec.tensorParallel || 1,
      pipelineParallel: s.spec.pipelineParallel || 1,
      dataParallel: s.spec.dataParallel || 1,
      nodes: s.spec.worldNodes || 1,
      gpusPerNode: s.spec.gpuIndices.length,
      args: [...s.spec.args],
      env: { ...s.spec.env },
      memoryFraction: s.spec.gpuMemoryUtilization,
    };
  }
  if (failed) {
    o.failure = {
      reason: s.reason || reported.replace("_", " "),
      ...(s.hasExitCode ? { exitCode: s.exitCode } : {}),
      ...(s.outputTail.length > 0 ? { outputTail: [...s.outputTail] } : {}),
    };
  }
  return o;
}

/** What an agent last said a shard runs: its PID (for operators) and spec (to claim it after adoption). */
interface Reported {
  pid?: number;
  spec?: StartShard;
}

const LIVE: ReadonlySet<string> = new Set(["starting", "ready", "draining"]);

export class Reconciler {
  readonly table = new ReplicaTable();
  /** Keyed by `shardKey`; lifecycle facts the planner does not need. */
  private readonly reported = new Map<string, Reported>();
  private catalog: Catalog;
  private config: Config;
  private timer: NodeJS.Timeout | undefined;
  private soon: NodeJS.Timeout | undefined;
  private graceTimer: NodeJS.Timeout | undefined;
  private readonly now: () => number;
  private readonly startedAt: number;
  passes = 0;
  lastPassMs = 0;

  constructor(
    private readonly deps: ReconcilerDeps,
    config: Config,
    catalog: Catalog,
  ) {
    this.config = config;
    this.catalog = catalog;
    this.now = deps.now ?? Date.now;
    this.startedAt = this.now();
    deps.streams.subscribe({
      onTransition: (t) => this.trigger(`${t.node} ${t.to}`),
      onRegister: (node, shards) => this.onRegister(node, shards),
      onShardStatus: (node, status) => this.onShardStatus(node, status),
    });
  }

  /** The PID an agent last reported for a shard; undefined before it reported one. */
  pidOf(replicaId: string, rank: number, node: string): number | undefined {
    return this.reported.get(shardKey(replicaId, rank, node))?.pid;
  }

  get currentCatalog(): Catalog {
    return this.catalog;
  }

  get currentConfig(): Config {
    return this.config;
  }

  start(): void {
    this.timer = setInterval(() => this.pass("interval"), this.config.control.interval);
    this.trigger("start");
    const placeAfter = this.settings().placeAfter;
    if (placeAfter !== undefined && placeAfter > this.now()) {
      this.graceTimer = setTimeout(() => this.trigger("startup grace over"), placeAfter - this.now());
    }
  }

  stop(): void {
    clearInterval(this.timer);
    clearTimeout(this.graceTimer);
    clearTimeout(this.soon);
  }

  /** A configuration reload (SIGHUP): new desired state, same actual state. */
  reload(config: Config, catalog: Catalog): void {
    this.config = config;
    this.catalog = catalog;
    clearInterval(this.timer);
    this.timer = setInterval(() => this.pass("interval"), config.control.interval);
    this.trigger("configuration reloaded");
  }

  /** Debounced: a burst of events (a fleet registering) costs one pass. */
  trigger(reason: string): void {
    if (this.soon) return;
    this.soon = setTimeout(() => {
      this.soon = undefined;
      this.pass(reason);
    }, 50);
  }

  private onRegister(node: string, shards: ShardStatus[]): void {
    const observed = shards.flatMap((s) => {
      const o = observedFrom(s);
      this.noteReported(node, s);
      return o ? [o] : [];
    });
    this.table.observeRegistration(node, observed, this.now());
    // An agent that restarted re-adopted its engines but holds them as
    // unclaimed, and stops them after its orphan grace unless the control
    // plane asks for them again: a StartShard of the running generation is
    // that claim. Replicas the table already owns are claimed now; ones it
    // learned from this registration wait for the plan's adopt.
    for (const o of observed) {
      const r = this.table.get(o.replicaId);
      if (r?.adopted && !r.retire) this.claim(node, r.id, o.rank, r.generation);
    }
    this.trigger(`${node} registered`);
  }

  private onShardStatus(node: string, status: ShardStatus): void {
    this.noteReported(node, status);
    const o = observedFrom(status);
    if (!o) return;
    const before = this.table
      .get(o.replicaId)
      ?.shards.find((s) => s.rank === o.rank && s.node === node)?.state;
    this.table.observe(node, o, this.now());
    if (before !== o.state) this.trigger(`${o.replicaId} rank ${o.rank} ${o.state}`);
  }

  /**
   * The key the engine of a replica's rank 0 on `node` was launched with, as
   * its agent reports it; undefined until it has. This, not what this
   * control plane would derive, is what the edge must send: the two differ
   * for an engine launched before engine keys (it has none) and after a
   * database was replaced (another secret).
   */
  launchedKey(replicaId: string, node: string, generation: number): string | undefined {
    const spec = this.reported.get(shardKey(replicaId, 0, node))?.spec;
    return spec && Number(spec.generation) === generation ? spec.engineApiKey : undefined;
  }

  /**
   * Each replica a rollout replaces, with why (its spec is not its
   * profile's now, or its engine key is retired); replicas on their way out
   * and ones whose spec is not known yet are not among them.
   */
  outdated(): Outdated[] {
    const retiredKeys = this.retiredKeys();
    return this.table.list().flatMap((replica) => {
      const p = this.catalog.profile(replica.model, replica.profile);
      const why = p && !replica.retire ? outdatedWhy(replica, p, retiredKeys) : undefined;
      return why ? [{ replica, why }] : [];
    });
  }

  /** The replicas whose engines run with a retired key, by id: what a rotation will replace. */
  retiredKeyReplicas(): string[] {
    return [...this.retiredKeys().keys()].sort();
  }

  /** Replica id → generation, for each engine an agent reports running with a retired key. */
  private retiredKeys(): Map<string, number> {
    const out = new Map<string, number>();
    const test = this.deps.retiredKey;
    if (!test) return out;
    for (const { spec } of this.reported.values()) {
      if (!spec || this.table.get(spec.replicaId)?.generation !== Number(spec.generation)) continue;
      if (test(spec.engineApiKey, spec.replicaId, Number(spec.generation)))
        out.set(spec.replicaId, Number(spec.generation));
    }
    return out;
  }

  nodes(): PlacementNode[] {
    return this.deps.registry.list().map((n) => placementNode(n, this.deps.intents.get(n.name)));
  }

  /**
   * With `startedAt`, the planner places nothing during the startup grace:
   * agents of a fleet that outlived a control plane restart need time to
   * report what they run, and placing before they have would start second
   * copies of replicas that are still serving.
   */
  settings() {
    return planSettings(this.config.control, this.startedAt);
  }

  explain(model: string) {
    return explainModel(this.planState(this.now(), false), model, this.now());
  }

  /**
   * The planner's input, with the scaling stage's replicas per profile: a
   * pass decides them anew, `explain`'s dry run reuses the last decision.
   */
  private planState(now: number, decide: boolean): PlanState {
    const state: PlanState = {
      ...this.table.planState(this.catalog, this.nodes(), this.settings()),
      retiredKeys: this.retiredKeys(),
    };
    const scaler = this.deps.scaler;
    if (!scaler) return state;
    return {
      ...state,
      desired: decide ? scaler.decide(state, this.config, now) : scaler.desired(this.catalog),
    };
  }

  pass(reason: string): Action[] {
    const started = performance.now();
    const now = this.now();
    const actions = plan(this.planState(now, true), now);
    for (const a of actions) this.send(a);
    this.table.apply(actions, now);
    this.passes++;
    this.deps.afterPass?.();
    this.lastPassMs = performance.now() - started;
    const acted = actions.filter((a) => a.kind !== "wait");
    if (acted.length > 0) {
      this.deps.log.info("reconcile pass", {
        reason,
        actions: acted.map((a) => `${a.kind} ${a.replicaId}: ${a.reason}`),
      });
    }
    return actions;
  }

  private noteReported(node: string, s: ShardStatus): void {
    const key = shardKey(s.replicaId, s.rank, node);
    if (shardStateFromWire(s.state) === "stopped") {
      this.reported.delete(key);
      return;
    }
    const rt = this.reported.get(key) ?? {};
    if (s.pid) rt.pid = s.pid;
    if (s.spec) rt.spec = s.spec;
    this.reported.set(key, rt);
  }

  /** Claims a shard the table holds live at `generation`. */
  private claim(node: string, replicaId: string, rank: number, generation: number): void {
    const r = this.table.get(replicaId);
    const shard = r?.shards.find((s) => s.node === node && s.rank === rank);
    if (!shard || !LIVE.has(shard.state)) return;
    this.sendClaim(node, replicaId, rank, generation);
  }

  /** Re-sends the exact spec a shard runs; the agent treats the same generation as a claim, not a restart. */
  private sendClaim(node: string, replicaId: string, rank: number, generation: number): void {
    const spec = this.reported.get(shardKey(replicaId, rank, node))?.spec;
    if (!spec || Number(spec.generation) !== generation) return;
    this.deps.streams.send(node, create(ControlMessageSchema, { msg: { case: "startShard", value: spec } }));
  }

  private send(a: Action): void {
    const { streams, log } = this.deps;
    switch (a.kind) {
      case "place": {
        const profile = this.catalog.profile(a.model, a.profile);
        if (!profile) return;
        for (const shard of a.assignment.shards) {
          const spec = this.startSpec(a.replicaId, a.generation, profile, a.assignment, shard.rank);
          const sent = streams.send(
            shard.node,
            create(ControlMessageSchema, { msg: { case: "startShard", value: spec } }),
          );
          if (!sent)
            log.warn("start not delivered: node has no open stream", {
              replica: a.replicaId,
              node: shard.node,
            });
        }
        return;
      }
      case "stop": {
        const r = this.table.get(a.replicaId);
        const graceMs = (r && this.catalog.profile(r.model, r.profile)?.stopGraceMs) ?? 30_000;
        for (const s of a.shards) {
          // A drained node's shards get until the operator's deadline to
          // finish what they serve; any other drain gets the profile's grace.
          const drainDeadline = this.deps.intents.get(s.node).drainDeadline;
          const deadlineMs = drainDeadline ? Math.max(graceMs, drainDeadline - this.now()) : graceMs;
          const msg =
            a.mode === "drain"
              ? create(ControlMessageSchema, {
                  msg: { case: "drainShard", value: { replicaId: a.replicaId, deadlineMs } },
                })
              : create(ControlMessageSchema, {
                  msg: { case: "stopShard", value: { replicaId: a.replicaId, reason: a.reason, graceMs } },
                });
          streams.send(s.node, msg);
        }
        return;
      }
      case "adopt":
        for (const s of this.table.get(a.replicaId)?.shards ?? [])
          this.claim(s.node, a.replicaId, s.rank, a.generation);
        return;
      case "reinstate":
        // Sent before the table applies the action, so the claim cannot look
        // the shards up there: the plan found them ready.
        for (const s of a.shards) this.sendClaim(s.node, a.replicaId, s.rank, a.generation);
        for (const s of a.stop) this.stopAtOnce(s.node, a.replicaId, a.reason);
        return;
      case "restart":
        for (const s of a.stop) this.stopAtOnce(s.node, a.replicaId, a.reason);
        return;
      default:
        return;
    }
  }

  /** A gang's other ranks, or a copy nobody needs: no grace, nothing is served from it. */
  private stopAtOnce(node: string, replicaId: string, reason: string): void {
    this.deps.streams.send(
      node,
      create(ControlMessageSchema, { msg: { case: "stopShard", value: { replicaId, reason, graceMs: 0 } } }),
    );
  }

  private startSpec(
    replicaId: string,
    generation: number,
    p: CatalogProfile,
    assignment: Assignment,
    rank: number,
  ): StartShard {
    const me = assignment.shards.find((s) => s.rank === rank)!;
    const peers = assignment.shards.map((s) => ({
      rank: s.rank,
      nodeName: s.node,
      address: this.deps.registry.get(s.node)?.advertiseAddress ?? s.node,
      ports: { http: s.ports.http, distInit: [...s.ports.distInit] },
    }));
    return create(StartShardSchema, {
      replicaId,
      rank,
      worldNodes: assignment.shards.length,
      engine: p.engine,
      model: p.source,
      servedModelName: p.model,
      args: [...p.config.engine_args],
      gpuIndices: [...me.gpus],
      ports: { http: me.ports.http, distInit: [...me.ports.distInit] },
      env: { ...p.config.env },
      tensorParallel: p.tensorParallel,
      pipelineParallel: p.pipelineParallel,
      dataParallel: p.dataParallel,
      peers,
      startupDeadlineMs: p.startupDeadlineMs,
      stopGraceMs: p.stopGraceMs,
      profile: p.name,
      mgmtInterface: this.config.control.mgmt_interface,
      minGpuMemoryMib: BigInt(p.minMemoryMiB),
      gpuMemoryUtilization: p.memoryFraction,
      generation: BigInt(generation),
      engineApiKey: this.deps.engineKey?.(replicaId, generation) ?? "",
    });
  }
}

const shardKey = (replicaId: string, rank: number, node: string) => `${replicaId}#${rank}@${node}`;
