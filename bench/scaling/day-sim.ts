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
import { type Admission, PoolCore } from "../../edge/routing/pool-core.ts";
import { EngineCore, type EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { promptTokenizer, Timeline } from "../routing/fleet-sim.ts";

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
  const tl = new Timeline();
  // Arrivals have their own stream, so every fleet sees the same requests.
  const rand = mulberry32(o.seed);
  const pickRand = mulberry32(o.seed + 1);
  const config = configSchema.parse({
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
  const catalog = buildCatalog(config);
  const settings = planSettings(config.control);
  const nodes: PlacementNode[] = Array.from({ length: o.nodes }, (_, i) =>
    gpuNode(`n${i}`, { gpus: o.gpusPerNode }),
  );
  const table = new ReplicaTable();
  const replicas = new Map<string, Replica>();
  const pools = new Map(o.models.map((m) => [m.name, new PoolCore(m.name, config.router, pickRand)]));
  const versions = new Map<string, number>();
  const polled = new Map<string, { pool: PolledPool; at: number }>();
  const scrapes = new Map<string, { waiting: number; kvUsage: number; scrapedAtUnixMs: bigint }>();
  const events: DayResult["events"] = [];
  const scaler = new Scaler({
    log: {
      info: (_msg, f) => {
        if (f) events.push({ model: String(f.model), at: tl.now, from: Number(f.from), to: Number(f.to) });
      },
    },
    edge: () => ({ polled: (model) => polled.get(model) }),
    load: (at) => scrapes.get(at.replicaId),
  });
  const tokens = promptTokenizer();
  const prompt = [{ role: "user", content: "Summarise the quarterly report in three sentences." }];
  const requests: DayRequest[] = [];
  let gpuMs = 0;
  let held = 0;
  let heldSince = 0;
  const hold = (delta: number) => {
    gpuMs += held * (tl.now - heldSince);
    held += delta;
    heldSince = tl.now;
  };

  const publish = (model: string) => {
    const v = (versions.get(model) ?? 0) + 1;
    versions.set(model, v);
    const ready = [...replicas.values()].filter((r) => r.model === model && r.ready && !r.draining);
    pools.get(model)!.setEndpoints(
      v,
      ready.map((r) => ({
        id: r.id,
        url: `http://${r.id}`,
        spillGroup: "default",
        priority: 0,
        weight: 1,
        via: "direct",
        // As the control plane publishes an engine's capacity: its batch from
        // its arguments, its KV tokens from its /metrics (cache_config_info).
        capacity: { maxSeqs: o.core.maxNumSeqs, kvTokens: o.core.numBlocks * o.core.blockSize },
      })),
      tl.now,
    );
    wakePool(model);
  };

  const wakes = new Map<string, number>();
  const wakePool = (model: string) => {
    const pool = pools.get(model)!;
    const at = pool.nextWakeAt();
    if (at === undefined || at >= (wakes.get(model) ?? Number.POSITIVE_INFINITY)) return;
    wakes.set(model, at);
    tl.at(at, () => {
      if (wakes.get(model) !== at) return;
      wakes.delete(model);
      pool.tick(tl.now);
      wakePool(model);
    });
  };

  const kick = (r: Replica) => {
    if (r.busy || !r.core.hasWork()) return;
    const step = r.core.startStep();
    if (!step) return;
    r.busy = true;
    tl.at(tl.now + step.seconds * 1000, () => {
      r.busy = false;
      for (const ev of r.core.finishStep(tl.now / 1000)) {
        if (ev.kind !== "token") continue;
        const req = inflight.get(ev.seq.spec.id)!;
        if (ev.index === 0) req.result.firstToken = tl.now;
        if (ev.finished) {
          inflight.delete(ev.seq.spec.id);
          pools.get(r.model)!.release(req.lease, { attempts: [{ endpoint: r.id, verdict: "ok" }] }, tl.now);
          wakePool(r.model);
        }
      }
      kick(r);
    });
  };

  const inflight = new Map<string, { lease: string; result: DayRequest }>();
  let seq = 0;
  const arrive = (m: DayModel) => {
    const gap = (-Math.log(1 - rand()) / m.peakRate) * 1000;
    tl.at(tl.now + gap, () => {
      if (tl.now >= o.durationMs) return;
      arrive(m);
      // Thinning: a Poisson process at peak rate, kept with probability rate(t) / peak.
      if (rand() * m.peakRate >= m.rate(tl.now)) return;
      const id = `q${seq++}`;
      const band = pickBand(o.bands, rand());
      const result: DayRequest = { model: m.name, band, arrival: tl.now, status: 200 };
      requests.push(result);
      const pool = pools.get(m.name)!;
      pool.admit({ id, band, key: id, policy: "least-load", prefix: [] }, tl.now, (a: Admission) => {
        if (!a.ok) {
          result.status = a.status;
          return;
        }
        const r = replicas.get(a.lease.endpoint.id)!;
        inflight.set(id, { lease: a.lease.id, result });
        r.core.submit({
          id,
          promptIds: tokens(prompt),
          maxTokens: o.outputTokens,
          naturalLength: Number.POSITIVE_INFINITY,
          nextToken: (k) => k,
          arrival: tl.now / 1000,
        });
        kick(r);
      });
      wakePool(m.name);
    });
  };

  const act = (a: Action) => {
    if (a.kind === "place") {
      const shard = a.assignment.shards[0]!;
      const r: Replica = {
        id: a.replicaId,
        model: a.model,
        node: shard.node,
        core: new EngineCore(o.core),
        busy: false,
        ready: false,
        draining: false,
      };
      replicas.set(r.id, r);
      hold(1);
      const gen = a.generation;
      tl.at(tl.now + o.loadMs, () => {
        if (replicas.get(r.id) !== r || r.draining) return;
        r.ready = true;
        table.observe(r.node, { replicaId: r.id, rank: 0, generation: gen, state: "ready" }, tl.now);
        publish(r.model);
      });
    } else if (a.kind === "stop") {
      const r = replicas.get(a.replicaId);
      if (!r) return;
      r.draining = true;
      publish(r.model);
      // A drain stops once the engine is idle; a stop does not wait.
      const gone = () => {
        if (a.mode === "drain" && (r.busy || r.core.hasWork())) {
          tl.at(tl.now + 1_000, gone);
          return;
        }
        replicas.delete(r.id);
        scrapes.delete(r.id);
        hold(-1);
        table.observe(r.node, { replicaId: r.id, rank: 0, state: "stopped" }, tl.now);
      };
      gone();
    }
  };

  const readyTrace: DayResult["readyTrace"] = [];
  const control = () => {
    for (const [name, pool] of pools) polled.set(name, { pool: pool.status(tl.now), at: tl.now });
    const state = table.planState(catalog, nodes, settings);
    const actions = plan({ ...state, desired: scaler.decide(state, config, tl.now) }, tl.now);
    table.apply(actions, tl.now);
    for (const a of actions) act(a);
    const ready: Record<string, number> = {};
    for (const r of replicas.values()) if (r.ready && !r.draining) ready[r.model] = (ready[r.model] ?? 0) + 1;
    readyTrace.push({ at: tl.now, ready });
    if (tl.now < o.durationMs) tl.at(tl.now + config.control.interval, control);
  };
  // Agents scrape every ready engine; the pool hears it as the control plane pushes it.
  const scrape = () => {
    const byModel = new Map<string, Parameters<PoolCore["updateLoad"]>[0][number][]>();
    for (const r of replicas.values()) {
      if (!r.ready) continue;
      const g = r.core.gauges();
      scrapes.set(r.id, {
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
      pools.get(model)!.updateLoad(updates, tl.now);
      wakePool(model);
    }
    if (tl.now < o.durationMs) tl.at(tl.now + config.router.scrape_interval, scrape);
  };

  let dayGpuMs = 0;
  tl.at(o.durationMs, () => {
    hold(0);
    dayGpuMs = gpuMs;
  });
  tl.at(0, control);
  tl.at(500, scrape);
  for (const m of o.models) arrive(m);
  while (tl.step()) {
    // Every callback schedules what follows it.
  }
  return { requests, gpuMs: dayGpuMs, events, readyTrace };
}

function pickBand(shares: Record<string, number>, u: number): string {
  let acc = 0;
  for (const [band, share] of Object.entries(shares)) {
    acc += share;
    if (u < acc) return band;
  }
  return "gold";
}
