/**
 * The vocabulary the routing modules share. Pure data: no Workers or Node
 * APIs anywhere under edge/routing/, so the ModelPool Durable Object, a
 * Worker isolate (fail-open), a unit test and the discrete-event benchmark
 * all host the same code.
 */
import type { RoutingPolicy } from "../router-config.ts";

export type { RoutingPolicy };

/** An engine the pool may send requests to (the endpoint set's record, minus what routing ignores). */
export interface EndpointSpec {
  id: string;
  url: string;
  /** Spill-over group: the best `priority` pool that can take a request gets it. */
  pool: string;
  /** Lower first; a pool's endpoints share one priority. */
  priority: number;
  /** Relative capacity (heterogeneous GPUs): scales its in-flight target and its share of traffic. */
  weight: number;
  via: "direct" | "vpc" | "tunnel";
}

/** What an agent scraped from an engine, as the control plane pushed it. */
export interface LoadSample {
  waiting: number;
  running: number;
  /** 0..1 */
  kvUsage: number;
  /** 0..1, informational */
  prefixCacheHitRate: number;
  /** When the engine was scraped (ms since the epoch, edge clock). */
  at: number;
  state: "ready" | "draining" | "down";
}

/** Which stage decided a pick: a tier of `chat`, or the baseline policy itself. */
export type RouteTier = "session" | "prefix" | "load" | "round-robin" | "least-load" | "random";

/** Why an endpoint was not a candidate, per stage: what `explain` and the pool's status show. */
export interface Rejection {
  endpoint: string;
  stage: "state" | "breaker" | "spill-over";
  reason: string;
}
