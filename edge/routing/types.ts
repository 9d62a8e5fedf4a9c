/**
 * The vocabulary the routing modules share. Pure data: no Workers or Node
 * APIs anywhere under edge/routing/, so the ModelPool Durable Object, a
 * Worker isolate (fail-open), a unit test and the discrete-event benchmark
 * all host the same code.
 */
import type { RoutingPolicy } from "../config/router.ts";

export type { RoutingPolicy };

/** An engine the pool may send requests to (the endpoint set's record, minus what routing ignores). */
export interface EndpointSpec {
  id: string;
  /** The site that published it (docs/sites.md); absent: the default site. */
  site?: string | undefined;
  url: string;
  /**
   * Its spill group (the config key `pool`, common/endpoint-fields.ts): the
   * group of best `priority` that can take a request gets it.
   */
  spillGroup: string;
  /** Lower first; a spill group's endpoints share one priority. */
  priority: number;
  /** Relative capacity (heterogeneous GPUs): scales its in-flight target and its share of traffic. */
  weight: number;
  via: "direct" | "vpc" | "tunnel";
  /** The model name this engine is sent, when it is not the catalog's (router-only, engines run by hand). */
  servedModelName?: string | undefined;
  /** What the engine can hold, when known (engine args, its /metrics, or the operator). */
  capacity?: Capacity | undefined;
}

/**
 * An engine's capacity: the batch it runs at once (`max_num_seqs`) and the
 * tokens its KV cache holds (`num_gpu_blocks` × `block_size`). Either may be
 * unknown; saturation then falls back to what it can assume (saturation.ts).
 */
export interface Capacity {
  maxSeqs?: number | undefined;
  kvTokens?: number | undefined;
}

/**
 * What a request is predicted to need of an engine, charged at admit and
 * freed at release so saturation is current at every decision: its prompt
 * (estimated from the body's characters) and its answer (`max_tokens`, or
 * the configured assumption).
 */
export interface Demand {
  promptTokens: number;
  outputTokens: number;
  /**
   * The caller will say when the first token came (a stream): only then does
   * the request also count as waiting for its prefill, since a response that
   * arrives whole shows no moment when that was done.
   */
  reportsFirstToken?: boolean | undefined;
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
  stage: "state" | "breaker" | "site" | "spill-over";
  reason: string;
}

/**
 * Where a request entered Cloudflare (`request.cf`, edge/location.ts): what
 * `router.sites` maps to an ordered site preference (site-preference.ts).
 */
export interface Location {
  /** `EU`, `NA`, … */
  continent?: string | undefined;
  /** ISO 3166 alpha-2. */
  country?: string | undefined;
  /** The Cloudflare data centre's IATA code. */
  colo?: string | undefined;
}
