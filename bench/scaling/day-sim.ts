/**
 * A day of a shared GPU fleet on a virtual clock: several models, each
 * behind the edge's real pool (PoolCore: band queues, picker), served by sim
 * engine cores (EngineCore), with the control plane's real reconcile loop —
 * the Scaler (demand sampling and the scaling stage), `plan` and the
 * ReplicaTable — starting replicas (after a load delay), draining and
 * stopping them. A discrete-event simulation on bench/routing's Timeline:
 * hours of traffic in seconds, the same seed giving the same run.
 *
 * What the control plane sees is what it would see deployed: each pool's
 * status once per `edge.status_interval`, and each ready engine's waiting
 * and KV as an agent scraped it.
 */
import { mulberry32 } from "../../common/rng.ts";
import { buildCatalog } from "../../controlplane/catalog.ts";
import { configSchema } from "../../controlplane/config/schema.ts";
import { gpuNode } from "../../controlplane/placement/builders.ts";
import type { PlacementNode } from "../../controlplane/placement/types.ts";
import { plan, planSettings } from "../../controlplane/reconcile/plan.ts";
import { ReplicaTable } from "../../controlplane/reconcile/table.ts";
import type { Action } from "../../controlplane/reconcile/types.ts";
import { type PolledPool, Scaler } from "../../controlplane/scaler.ts";
import { plainEndpoint } from "../../edge/routing/plain-endpoint.ts";
import { type Admission, PoolCore } from "../../edge/routing/pool-core.ts";
import { EngineCore, type EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { promptTokenizer } from "../routing/fleet-sim.ts";
import { PoolAlarm } from "../routing/pool-alarm.ts";
import { Timeline } from "../routing/timeline.ts";

export interface DayModel {
  name: string;
  min: number;
  max: number;
  priority: number;
  /** Offered requests per second at virtual time t (ms). */
  rate: (t: number) => number;
  peakRate: number;
}

export interface DayOptions {
  models: readonly DayModel[];
  /** Nodes × GPUs each. */
  nodes: number;
  gpusPerNode: number;
  durationMs: number;
  /** Placement to ready, as a real engine loading its weights. */
  loadMs: number;
  core: EngineCoreConfig;
  /** The config's `scaling:` and `router:` sections. */
  scaling: Record<string, unknown>;
  router?: Record<string, unknown>;
  outputTokens: number;
  /** Share of requests per band, the rest gold. */
  bands: Record<string, number>;
  seed: number;
}

export interface DayRequest {
  model: string;
  band: string;
  arrival: number;
  status: number;
  firstToken?: number;
}

export interface DayResult {
  requests: DayRequest[];
  /** GPU-milliseconds held by replicas (placed until stopped) within the day. */
  gpuMs: number;
  events: { model: string; at: number; from: number; to: number }[];
  /** Ready replicas per model, sampled every control interval. */
  readyTrace: { at: number; ready: Record<string, number> }[];
}

interface Replica {
  id: string;
  model: string;
  node: string;
  core: EngineCore;
  busy: boolean;
  ready: boolean;
  draining: boolean;
}

export function simulateDay(o: DayOptions): DayResult {
  return new DaySimulation(o).run();
}

type LoadUpdate = Parameters<PoolCore["updateLoad"]>[0][number];

const PROMPT = [{ role: "user", content: "Summarise the quarterly report in three sentences." }];

/**
 * One day on one virtual clock. `run` schedules the day's end, the first
 * control pass, the first scrape and each model's first arrival, in that
 * order; each event schedules what follows it.
 */
class DaySimulation {
  private readonly tl = new Timeline();
  // Arrivals have their own stream, so every fleet sees the same requests.
  private readonly rand: () => number;
  private readonly config: ReturnType<typeof configSchema.parse>;
  private readonly catalog: ReturnType<typeof buildCatalog>;
  private readonly settings: ReturnType<typeof planSettings>;
  private readonly nodes: PlacementNode[];
  private readonly table = new ReplicaTable();
  private readonly replicas = new Map<string, Replica>();
  private readonly pools: Map<string, PoolCore>;
  private readonly versions = new Map<string, number>();
  private readonly polled = new Map<string, { pool: PolledPool; at: number }>();
  private readonly scrapes = new Map<string, { waiting: number; kvUsage: number; scrapedAtUnixMs: bigint }>();
  private readonly events: DayResult["events"] = [];
  private readonly scaler: Scaler;
  private readonly tokens = promptTokenizer();
  private readonly requests: DayRequest[] = [];
  private readonly readyTrace: DayResult["readyTrace"] = [];
  private readonly inflight = new Map<string, { lease: string; result: DayRequest }>();
  private readonly alarms: Map<string, PoolAlarm>;
  private seq = 0;
  private gpuMs = 0;
  private held = 0;
  private heldSince = 0;

  constructor(private readonly o: DayOptions) {
    this.rand = mulberry32(o.seed);
    const pickRand = mulberry32(o.seed + 1);
    this.config = configSchema.parse({
      control: { interval: "5s" },
      edge: { status_interval: "5s" },
      router: o.router ?? {},
      scaling: o.scaling,
      models: o.models.map((m) => ({
        name: m.name,
        priority: m.priority,
        profiles: [{ name: "1gpu", engine: "sim", source: m.name, replicas: { min: m.min, max: m.max } }],
      })),
    });
    this.catalog = buildCatalog(this.config);
    this.settings = planSettings(this.config.control);
    this.nodes = Array.from({ length: o.nodes }, (_, i) => gpuNode(`n${i}`, { gpus: o.gpusPerNode }));
    this.pools = new Map(o.models.map((m) => [m.name, new PoolCore(m.name, this.config.router, pickRand)]));
    this.alarms = new Map([...this.pools].map(([name, pool]) => [name, new PoolAlarm(this.tl, pool)]));
    this.scaler = new Scaler({
      log: {
        info: (_msg, f) => {
          if (f)
            this.events.push({
              model: String(f.model),
              at: this.tl.now,
              from: Number(f.from),
              to: Number(f.to),
            });
        },
      },
      edge: () => ({ polled: (model) => this.polled.get(model) }),
      load: (at) => this.scrapes.get(at.replicaId),
    });
  }

  run(): DayResult {
    let dayGpuMs = 0;
    this.tl.at(this.o.durationMs, () => {
      this.hold(0);
      dayGpuMs = this.gpuMs;
    });
    this.tl.at(0, () => this.control());
    this.tl.at(500, () => this.scrape());
    for (const m of this.o.models) this.arrive(m);
    while (this.tl.step()) {
      // Every callback schedules what follows it.
    }
    return { requests: this.requests, gpuMs: dayGpuMs, events: this.events, readyTrace: this.readyTrace };
  }

  /** GPU-time accounting: what was held until now is counted, then `delta` GPUs more are held. */
  private hold(delta: number): void {
    this.gpuMs += this.held * (this.tl.now - this.heldSince);
    this.held += delta;
    this.heldSince = this.tl.now;
  }

  /** The model's ready replicas as its pool's new endpoint set, as the control plane publishes it. */
  private publish(model: string): void {
    const v = (this.versions.get(model) ?? 0) + 1;
    this.versions.set(model, v);
    const ready = [...this.replicas.values()].filter((r) => r.model === model && r.ready && !r.draining);
    const o = this.o;
    this.pools.get(model)!.setEndpoints(
      v,
      ready.map((r) =>
        plainEndpoint(r.id, {
          // As the control plane publishes an engine's capacity: its batch from
          // its arguments, its KV tokens from its /metrics (cache_config_info).
          capacity: { maxSeqs: o.core.maxNumSeqs, kvTokens: o.core.numBlocks * o.core.blockSize },
        }),
      ),
      this.tl.now,
    );
    this.wakePool(model);
  }

  /** After any call to a pool. */
  private wakePool(model: string): void {
    this.alarms.get(model)!.arm();
  }

  /** Starts the replica's next step if it is idle and has work; the step's tokens land when it ends. */
  private kick(r: Replica): void {
    if (r.busy || !r.core.hasWork()) return;
    const step = r.core.startStep();
    if (!step) return;
    r.busy = true;
    const tl = this.tl;
    tl.at(tl.now + step.seconds * 1000, () => {
      r.busy = false;
      for (const ev of r.core.finishStep(tl.now / 1000)) {
        if (ev.kind !== "token") continue;
        const req = this.inflight.get(ev.seq.spec.id)!;
        if (ev.index === 0) req.result.firstToken = tl.now;
        if (ev.finished) {
          this.inflight.delete(ev.seq.spec.id);
          this.pools
            .get(r.model)!
            .release(req.lease, { attempts: [{ endpoint: r.id, verdict: "ok" }] }, tl.now);
          this.wakePool(r.model);
        }
      }
      this.kick(r);
    });
  }

  /** The model's next arrival: a Poisson process at peak rate, thinned to rate(t). */
  private arrive(m: DayModel): void {
    const tl = this.tl;
    const gap = (-Math.log(1 - this.rand()) / m.peakRate) * 1000;
    tl.at(tl.now + gap, () => {
      if (tl.now >= this.o.durationMs) return;
      this.arrive(m);
      // Thinning: a Poisson process at peak rate, kept with probability rate(t) / peak.
      if (this.rand() * m.peakRate >= m.rate(tl.now)) return;
      const id = `q${this.seq++}`;
      const band = pickBand(this.o.bands, this.rand());
      const result: DayRequest = { model: m.name, band, arrival: tl.now, status: 200 };
      this.requests.push(result);
      this.pools
        .get(m.name)!
        .admit({ id, band, key: id, policy: "least-load", prefix: [] }, tl.now, (a) =>
          this.admitted(id, result, a),
        );
      this.wakePool(m.name);
    });
  }

  private admitted(id: string, result: DayRequest, a: Admission): void {
    if (!a.ok) {
      result.status = a.status;
      return;
    }
    const r = this.replicas.get(a.lease.endpoint.id)!;
    this.inflight.set(id, { lease: a.lease.id, result });
    r.core.submit({
      id,
      promptIds: this.tokens(PROMPT),
      maxTokens: this.o.outputTokens,
      naturalLength: Number.POSITIVE_INFINITY,
      nextToken: (k) => k,
      arrival: this.tl.now / 1000,
    });
    this.kick(r);
  }

  /** What the agent does for a plan's action: a placed replica is ready after loadMs; a stopped one goes (a drain once idle). */
  private act(a: Action): void {
    if (a.kind === "place") this.place(a);
    else if (a.kind === "stop") this.stop(a);
  }

  private place(a: Extract<Action, { kind: "place" }>): void {
    const tl = this.tl;
    const shard = a.assignment.shards[0]!;
    const r: Replica = {
      id: a.replicaId,
      model: a.model,
      node: shard.node,
      core: new EngineCore(this.o.core),
      busy: false,
      ready: false,
      draining: false,
    };
    this.replicas.set(r.id, r);
    this.hold(1);
    const gen = a.generation;
    tl.at(tl.now + this.o.loadMs, () => {
      if (this.replicas.get(r.id) !== r || r.draining) return;
      r.ready = true;
      this.table.observe(r.node, { replicaId: r.id, rank: 0, generation: gen, state: "ready" }, tl.now);
      this.publish(r.model);
    });
  }

  private stop(a: Extract<Action, { kind: "stop" }>): void {
    const tl = this.tl;
    const r = this.replicas.get(a.replicaId);
    if (!r) return;
    r.draining = true;
    this.publish(r.model);
    // A drain stops once the engine is idle; a stop does not wait.
    const gone = () => {
      if (a.mode === "drain" && (r.busy || r.core.hasWork())) {
        tl.at(tl.now + 1_000, gone);
        return;
      }
      this.replicas.delete(r.id);
      this.scrapes.delete(r.id);
      this.hold(-1);
      this.table.observe(r.node, { replicaId: r.id, rank: 0, state: "stopped" }, tl.now);
    };
    gone();
  }

  /** One control-loop pass: poll the pools, decide and plan, act; every control.interval. */
  private control(): void {
    const tl = this.tl;
    for (const [name, pool] of this.pools) this.polled.set(name, { pool: pool.status(tl.now), at: tl.now });
    const state = this.table.planState(this.catalog, this.nodes, this.settings);
    const actions = plan({ ...state, desired: this.scaler.decide(state, this.config, tl.now) }, tl.now);
    this.table.apply(actions, tl.now);
    for (const a of actions) this.act(a);
    const ready: Record<string, number> = {};
    for (const r of this.replicas.values())
      if (r.ready && !r.draining) ready[r.model] = (ready[r.model] ?? 0) + 1;
    this.readyTrace.push({ at: tl.now, ready });
    if (tl.now < this.o.durationMs) tl.at(tl.now + this.config.control.interval, () => this.control());
  }

  /** Agents scrape every ready engine; the pool hears it as the control plane pushes it. */
  private scrape(): void {
    const tl = this.tl;
    const byModel = new Map<string, LoadUpdate[]>();
    for (const r of this.replicas.values()) {
      if (!r.ready) continue;
      const g = r.core.gauges();
      this.scrapes.set(r.id, {
        waiting: g.waiting,
        kvUsage: g.kvUsage,
        scrapedAtUnixMs: BigInt(Math.round(tl.now)),
      });
      const list = byModel.get(r.model) ?? [];
      list.push({
        endpoint: r.id,
        sample: {
          waiting: g.waiting,
          running: g.running,
          kvUsage: g.kvUsage,
          prefixCacheHitRate: 0,
          at: tl.now,
          state: "ready" as const,
        },
      });
      byModel.set(r.model, list);
    }
    for (const [model, updates] of byModel) {
      this.pools.get(model)!.updateLoad(updates, tl.now);
      this.wakePool(model);
    }
    if (tl.now < this.o.durationMs) tl.at(tl.now + this.config.router.scrape_interval, () => this.scrape());
  }
}

function pickBand(shares: Record<string, number>, u: number): string {
  let acc = 0;
  for (const [band, share] of Object.entries(shares)) {
    acc += share;
    if (u < acc) return band;
  }
  return "gold";
}
