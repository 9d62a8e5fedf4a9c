import type { Logger } from "../common/log.ts";
import type { MetricsRegistry } from "../common/prometheus.ts";
import type { ShardLoad } from "../proto/gen/agent/v1/agent_pb.ts";
import type { Catalog } from "./catalog.ts";
import type { Config } from "./config/schema.ts";
import type { ShardAt } from "./load-board.ts";
import { type ModelScale, type ScaleEvent, type ScaleMemory, scale, spread } from "./reconcile/scale.ts";
import type { PlanState, ReplicaRecord } from "./reconcile/types.ts";
import {
  agentReading,
  DemandWindow,
  type EdgeDelta,
  type EdgeReading,
  edgeDelta,
  edgeReading,
  type PoolFigures,
  sampleOf,
} from "./scaling/demand.ts";

/**
 * The live shell around the scaling stage (reconcile/scale.ts): before each
 * reconcile pass it takes a demand sample per model from the edge's pool
 * status (as the edge status poller last received it) and the agents'
 * scrapes (the load board), at most once per `control.interval` so a burst
 * of event-driven passes does not weigh more in the window; then it runs the
 * stage, keeps its memory, and logs and counts each scale event.
 */
export interface ScalerDeps {
  log: Pick<Logger, "info">;
  /** The edge status poller's book (EdgeStatusBook); undefined without an edge link. */
  edge: () => { polled(model: string): { pool: PolledPool; at: number } | undefined } | undefined;
  /** A shard's last scrape (the load board). */
  load: (at: ShardAt) => Pick<ShardLoad, "waiting" | "kvUsage" | "scrapedAtUnixMs"> | undefined;
}

/** What the scaler reads of a polled pool: EdgeSync's PoolStatus has it, and so does a simulation's. */
export type PolledPool = PoolFigures & { error?: string };

const ready = (r: ReplicaRecord) =>
  !r.retire && r.shards.length > 0 && r.shards.every((s) => s.state === "ready");

export class Scaler {
  private readonly windows = new Map<string, DemandWindow>();
  private readonly edgeSeen = new Map<string, { reading: EdgeReading; delta: EdgeDelta }>();
  private memory = new Map<string, ScaleMemory>();
  private latest = new Map<string, ModelScale>();
  private sampledAt = Number.NEGATIVE_INFINITY;
  readonly events = new Map<string, { up: number; down: number }>();

  constructor(private readonly deps: ScalerDeps) {}

  /** Samples (when due), decides, and returns the replicas per profile for `plan`. */
  decide(state: PlanState, config: Config, now: number): Map<string, number> {
    if (now - this.sampledAt >= config.control.interval * 0.9) {
      this.sample(state, config, now);
      this.sampledAt = now;
    }
    const signals = new Map(
      state.catalog.models.map((m) => {
        const w = this.windows.get(m.name);
        return [m.name, { signal: w?.signal(), sources: w?.sources ?? ["no sample yet"] }];
      }),
    );
    const out = scale(
      {
        catalog: state.catalog,
        nodes: state.nodes,
        replicas: state.replicas,
        portRange: state.settings.portRange,
        signals,
        memory: this.memory,
      },
      now,
    );
    this.memory = out.memory;
    this.latest = out.models;
    for (const e of out.events) this.record(e);
    return out.desired;
  }

  /** What the last decision wants per profile, without deciding again (for `ctl explain`'s dry run). */
  desired(catalog: Catalog): Map<string, number> {
    const out = new Map<string, number>();
    for (const m of catalog.models) {
      const mem = this.memory.get(m.name);
      for (const [k, n] of spread(m, mem?.desired ?? 0)) out.set(k, n);
    }
    return out;
  }

  /** The last pass's reasoning for a model. */
  view(model: string): ModelScale | undefined {
    return this.latest.get(model);
  }

  private record(e: ScaleEvent): void {
    const direction = e.to > e.from ? "up" : "down";
    const n = this.events.get(e.model) ?? { up: 0, down: 0 };
    n[direction]++;
    this.events.set(e.model, n);
    this.deps.log.info(`scale ${direction}`, { model: e.model, from: e.from, to: e.to, why: e.why });
  }

  private sample(state: PlanState, config: Config, now: number): void {
    const book = this.deps.edge();
    const fresh = 3 * config.edge.status_interval;
    for (const m of state.catalog.models) {
      if (m.routerOnly) continue;
      let delta: EdgeDelta | undefined;
      let missing = "";
      const polled = book?.polled(m.name);
      if (!book) missing = "no edge link (edge.url and its secret are not both set)";
      else if (!polled) missing = "its pool has not answered a poll yet";
      else if (polled.pool.error) missing = `its pool did not answer: ${polled.pool.error}`;
      else if (now - polled.at > fresh) missing = `last poll ${Math.round((now - polled.at) / 1000)}s old`;
      else delta = this.edgeDeltaOf(m.name, polled.pool, polled.at);
      const agents = this.agentReading(m.name, state.replicas, config, now);
      const w = this.windows.get(m.name) ?? new DemandWindow();
      w.add(sampleOf(now, delta, missing, agents), m.scaling.windowMs);
      this.windows.set(m.name, w);
    }
  }

  /** The backlog between this poll and the previous one; the same poll read twice keeps its delta. */
  private edgeDeltaOf(model: string, pool: PolledPool, at: number): EdgeDelta {
    const seen = this.edgeSeen.get(model);
    if (seen && seen.reading.at === at) return seen.delta;
    const reading = edgeReading(at, pool);
    const delta = edgeDelta(seen?.reading, reading);
    this.edgeSeen.set(model, { reading, delta });
    return delta;
  }

  private agentReading(model: string, replicas: readonly ReplicaRecord[], config: Config, now: number) {
    const mine = replicas.filter((r) => r.model === model && ready(r));
    const loads = mine.flatMap((r) => {
      const head = r.shards.find((s) => s.rank === 0);
      const load = head && this.deps.load({ replicaId: r.id, rank: 0, node: head.node });
      const age = load ? now - Number(load.scrapedAtUnixMs) : Number.POSITIVE_INFINITY;
      return load && age <= config.router.stale_after ? [load] : [];
    });
    return agentReading(mine.length, loads, config.router.scoring);
  }
}

/** `llmgw_scaling_*`: desired against ready per model, the demand, and the scale events. */
export function registerScalingMetrics(
  metrics: MetricsRegistry,
  scaler: Scaler,
  catalog: () => Catalog,
): void {
  const perModel = (value: (m: ModelScale) => number | undefined) => () =>
    catalog().models.flatMap((c) => {
      const m = scaler.view(c.name);
      const v = m && value(m);
      return v === undefined ? [] : [{ labels: { model: c.name }, value: v }];
    });
  metrics.gauge(
    "llmgw_scaling_desired_replicas",
    "Replicas the scaling stage wants for the model, within replicas.min..max.",
    perModel((m) => m.desired),
  );
  metrics.gauge(
    "llmgw_scaling_ready_replicas",
    "Replicas of the model that are ready (serving).",
    perModel((m) => m.ready),
  );
  metrics.gauge(
    "llmgw_scaling_demand_replicas",
    "The model's demand over the scaling window, in replicas at saturation 1. Only with a demand signal in the window.",
    perModel((m) => m.signal?.demand),
  );
  metrics.counter("llmgw_scaling_events_total", "Scale decisions, by direction.", () =>
    catalog().models.flatMap((c) => {
      if (!scaler.view(c.name)) return [];
      const n = scaler.events.get(c.name) ?? { up: 0, down: 0 };
      return [
        { labels: { model: c.name, direction: "up" }, value: n.up },
        { labels: { model: c.name, direction: "down" }, value: n.down },
      ];
    }),
  );
}
