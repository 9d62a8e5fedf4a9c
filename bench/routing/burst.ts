/**
 * A burst on the simulated fleet: bronze steps from idle to a multiple of
 * what the fleet can serve, all at once, and platinum starts arriving
 * after it, with load scraped every 2 s and pushed every 1 s as deployed.
 * Run twice in one go, side by side: with each engine's capacity known and
 * every admit charged its predicted demand (the design now), and with only
 * the constant in-flight target (the design before, which let a burst past
 * the ceilings until the scraped figures caught up).
 */
import type { RouterConfig } from "../../edge/config/router.ts";
import { percentile } from "../../loadgen/stats.ts";
import type { Workload } from "../../loadgen/workloads.ts";
import type { EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { type RequestResult, type SimRequest, simulateFleet } from "./fleet-sim.ts";
import { requestsFor } from "./levels.ts";

export interface BurstSpec {
  workload: Workload;
  engines: number;
  core: EngineCoreConfig;
  settings: RouterConfig;
  /** Bronze's arrival rate during the burst, req/s. */
  bronzeRate: number;
  /** Platinum's arrival rate, req/s, from `platinumFromS` to the burst's end. */
  platinumRate: number;
  platinumFromS: number;
  burstS: number;
  seed: number;
  /** The admission design: the constant in-flight target, capacity and demand, and the first tokens on top. */
  design: BurstDesign;
}

export type BurstDesign = "in-flight target" | "capacity + demand" | "+ first tokens";

export interface BurstResult {
  /** Platinum TTFT, ms: under the burst, and alone at the same rate. */
  platinum: { p50: number; p99: number; unloadedP99: number; served: number; requests: number };
  bronze: { requests: number; served: number; full: number; expired: number };
  /** From the burst's first request to the first bronze request held back (queued or refused); null if none was. */
  ceilingAfterMs: number | null;
}

function platinumArrivals(spec: BurstSpec): SimRequest[] {
  return requestsFor(spec.workload, spec.platinumRate, spec.burstS - spec.platinumFromS, spec.seed + 7).map(
    (r) => ({
      ...r,
      id: `p-${r.id}`,
      at: r.at + spec.platinumFromS * 1000,
      band: "platinum",
    }),
  );
}

function run(spec: BurstSpec, requests: SimRequest[]): RequestResult[] {
  return simulateFleet(
    {
      engines: spec.engines,
      core: spec.core,
      policy: "chat",
      settings: spec.settings,
      seed: spec.seed,
      knownCapacity: spec.design !== "in-flight target",
      firstTokens: spec.design === "+ first tokens",
    },
    requests.sort((a, b) => a.at - b.at),
  ).requests;
}

const ttfts = (rs: readonly RequestResult[]) =>
  rs
    .filter((r) => r.firstToken !== undefined)
    .map((r) => r.firstToken! - r.arrival)
    .sort((a, b) => a - b);

export function runBurst(spec: BurstSpec): BurstResult {
  const bronze = requestsFor(spec.workload, spec.bronzeRate, spec.burstS, spec.seed).map((r) => ({
    ...r,
    id: `b-${r.id}`,
    band: "bronze",
  }));
  const platinum = platinumArrivals(spec);
  const loaded = run(spec, [...bronze, ...platinum]);
  const alone = run(spec, platinumArrivals(spec));
  const p = loaded.filter((r) => r.band === "platinum");
  const b = loaded.filter((r) => r.band === "bronze");
  const held = b.filter((r) => r.queuedMs > 0 || r.status !== 200).sort((x, y) => x.arrival - y.arrival)[0];
  const t = ttfts(p);
  return {
    platinum: {
      p50: percentile(t, 50) ?? Number.NaN,
      p99: percentile(t, 99) ?? Number.NaN,
      unloadedP99: percentile(ttfts(alone), 99) ?? Number.NaN,
      served: p.filter((r) => r.status === 200).length,
      requests: p.length,
    },
    bronze: {
      requests: b.length,
      served: b.filter((r) => r.status === 200).length,
      full: b.filter((r) => r.code === "queue_full").length,
      expired: b.filter((r) => r.code === "queue_timeout").length,
    },
    ceilingAfterMs: held ? held.arrival : null,
  };
}
