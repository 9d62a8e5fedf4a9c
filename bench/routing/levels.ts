/**
 * One simulated load level, measured the way `llmgw bench` measures a real
 * one (loadgen/stats.ts), plus what only a simulation can see: the engines'
 * prefix-cache hit rate. Warm-up is left out: requests arriving before the
 * window starts are served but not counted, and throughput is the tokens
 * that came out inside the window, so an overloaded level shows what the
 * fleet delivered rather than what was offered.
 */

import type { RouterConfig } from "../../edge/config/router.ts";
import type { RoutingPolicy } from "../../edge/routing/types.ts";
import { ENDPOINT_HEADER, LevelStats, type LevelSummary, ROUTE_HEADER } from "../../loadgen/stats.ts";
import type { Workload } from "../../loadgen/workloads.ts";
import type { EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { type FleetResult, type SimRequest, simulateFleet } from "./fleet-sim.ts";

export interface LevelSpec {
  workload: Workload;
  policy: RoutingPolicy;
  /** Offered requests per second (Poisson). */
  rate: number;
  engines: number;
  core: EngineCoreConfig;
  settings: RouterConfig;
  /** FleetOptions.knownCapacity: false runs the design before capacity was known. */
  knownCapacity?: boolean;
  warmupS: number;
  measureS: number;
  seed: number;
}

export interface Level {
  spec: LevelSpec;
  summary: LevelSummary;
  /** Prompt tokens the engines found cached, within the window. */
  hitRate: number;
  /** Requests per engine over the window: max / mean. */
  spread: number;
  simulatedS: number;
}

export function requestsFor(workload: Workload, rate: number, seconds: number, seed: number): SimRequest[] {
  const out: SimRequest[] = [];
  const it = workload.iterate({ rate, seed });
  for (let r = it.next(); !r.done && r.value.at < seconds; r = it.next()) {
    out.push({ ...r.value, at: r.value.at * 1000, key: r.value.session ?? r.value.id });
  }
  return out;
}

export function runLevel(spec: LevelSpec): Level {
  const start = spec.warmupS * 1000;
  const end = start + spec.measureS * 1000;
  const requests = requestsFor(spec.workload, spec.rate, spec.warmupS + spec.measureS, spec.seed);
  const fleet: FleetResult = simulateFleet(
    {
      engines: spec.engines,
      core: spec.core,
      policy: spec.policy,
      settings: spec.settings,
      seed: spec.seed,
      window: { start, end },
      ...(spec.knownCapacity !== undefined ? { knownCapacity: spec.knownCapacity } : {}),
    },
    requests,
  );
  const ids = Array.from({ length: spec.engines }, (_, i) => `e${i}`);
  const stats = new LevelStats({ kind: "rate", value: spec.rate }, ids);
  let windowTokens = 0;
  for (const r of fleet.requests) {
    // Tokens out inside the window, from every request, measured or not.
    if (r.firstToken !== undefined) {
      let t = r.firstToken;
      if (t >= start && t < end) windowTokens++;
      for (const g of r.gaps) {
        t += g;
        if (t >= start && t < end) windowTokens++;
      }
    }
    if (r.arrival < start || r.arrival >= end) continue;
    const ok = r.status === 200;
    stats.add({
      ok,
      status: r.status,
      ...(ok ? {} : { error: `${r.status} ${r.code}` }),
      ...(r.firstToken !== undefined ? { ttft: (r.firstToken - r.arrival) / 1000 } : {}),
      e2e: ((r.end ?? r.arrival) - r.arrival) / 1000,
      itl: r.gaps.map((g) => g / 1000),
      outputTokens: r.outputTokens,
      headers: {
        ...(r.endpoint ? { [ENDPOINT_HEADER]: r.endpoint } : {}),
        ...(r.route ? { [ROUTE_HEADER]: r.route } : {}),
      },
      band: r.band,
    });
  }
  const summary = stats.summary(spec.measureS);
  summary.outputTokensPerSecond = windowTokens / spec.measureS;
  let q = 0;
  let h = 0;
  for (const e of fleet.engines) {
    q += e.window?.prefixQueries ?? 0;
    h += e.window?.prefixHits ?? 0;
  }
  return {
    spec,
    summary,
    hitRate: q > 0 ? h / q : 0,
    spread: summary.endpoints?.maxOverMean ?? 1,
    simulatedS: fleet.durationMs / 1000,
  };
}

/**
 * The knee of a sweep: the highest offered rate the fleet keeps up with —
 * every measured request served (success ≥ 99 %: no queue overflowing or
 * timing out) and TTFT p90 within `ttftSloS`. Past it, queues grow without
 * bound and only the time limits end them.
 */
export function knee(levels: readonly Level[], ttftSloS: number): Level | undefined {
  let best: Level | undefined;
  for (const l of levels) {
    const s = l.summary;
    if (s.successRate >= 0.99 && s.ttft.p90 !== null && s.ttft.p90 <= ttftSloS) {
      if (!best || l.spec.rate > best.spec.rate) best = l;
    }
  }
  return best;
}
