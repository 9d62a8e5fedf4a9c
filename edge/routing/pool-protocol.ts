/**
 * What a model's pool and its callers exchange (docs/routing.md, "A
 * request's two messages"): the admit request and its lease or refusal, the
 * release report, the coalesced call that carries them, load updates, and
 * the status the pool shows. Data only,
 * so the Worker, the Durable Object, EdgeSync and the benchmarks share the
 * words without the pool's machinery.
 */
import type { BreakerState } from "./breaker.ts";
import type {
  Demand,
  EndpointSpec,
  LoadSample,
  Location,
  Rejection,
  RouteTier,
  RoutingPolicy,
} from "./types.ts";

export interface AdmitRequest {
  /** The lease id: the request id, unique per request. */
  id: string;
  band: string;
  /** Fairness within a band: the API key's id. */
  key: string;
  policy: RoutingPolicy;
  session?: string | undefined;
  prefix: readonly number[];
  /** What the request will need of an engine; without it, a sequence and `assumed_output_tokens`. */
  demand?: Demand | undefined;
  /** Usage the caller estimated for this model since its last admit, for the pool's counter. */
  estimated?: EstimatedUsage | undefined;
  /** Where the request entered Cloudflare: its site preference (router.sites, site-preference.ts). */
  location?: Location | undefined;
}

/** Requests charged the edge's estimate because the engine reported no usage, and their tokens. */
export interface EstimatedUsage {
  requests: number;
  tokens: number;
}

export interface Lease {
  id: string;
  endpoint: EndpointSpec;
  alternates: EndpointSpec[];
  route: RouteTier;
  band: string;
  /** Time spent in the band's queue. */
  queuedMs: number;
  /** The pool's saturation when the lease was granted. */
  saturation: number;
  /** For a stream: how soon the pool wants to hear of its first token (PoolCore.prefilled). */
  firstTokenNote?: "now" | "with-next-call";
  /** Admitted by the isolate from a grant of the pool's, without a call (Grant). */
  granted?: boolean;
}

/**
 * A slot the pool set aside for an isolate's next request like the one it
 * was granted for (docs/routing.md, "Grants"): while the pool is far below
 * every ceiling, the isolate may admit such a request to `endpoint` at
 * once, without a call, and tell the pool afterwards. The slot counts as a
 * request in flight from the moment it is granted, so every band's ceiling
 * holds as if the request had been admitted then.
 */
export interface Grant {
  /** Becomes the lease id of the request that uses it. */
  id: string;
  endpoint: EndpointSpec;
  alternates: EndpointSpec[];
  /** The tier that chose the endpoint for a request like the basis. */
  route: RouteTier;
  /** What a request must share with the one it was granted for to use it: its prompt's leading blocks, and where it entered Cloudflare (its site preference). */
  prefix: readonly number[];
  location?: Location | undefined;
  /** The endpoint set it was chosen from. */
  endpointsVersion: number;
  saturation: number;
}

/**
 * Grants a channel is kept stocked with, as far as its calls' admits and
 * uses are like one another: one request after another, the next starts
 * as the last ends, before the answer to the call that reports the last
 * one's use is back with a grant; the second slot covers that answer's way,
 * which from a far pool is the distance to it.
 */
export const GRANT_STOCK = 2;

/** A request an isolate admitted from a grant: the pool charges and records it as if it had decided it. */
export interface GrantUse {
  grant: string;
  /** The grant's endpoint, for a pool that no longer holds the grant (it expired, the pool restarted). */
  endpoint: string;
  req: AdmitRequest;
  /**
   * Sent again because the call that carried it was lost: the pool may have
   * taken it then, so this counts only while the grant's slot is still set
   * aside, and a request is never counted twice.
   */
  resent?: true;
}

export type RefusalCode = "queue_full" | "queue_timeout" | "no_endpoints" | "no_capacity" | "abandoned";

export type Admission =
  | { ok: true; lease: Lease }
  | { ok: false; status: 429 | 503; code: RefusalCode; message: string; retryAfterMs: number };

export type Verdict = "ok" | "fail" | "abandon";
/**
 * One call from an isolate's channel to its model's pool (docs/routing.md,
 * "Coalesced calls"): whatever the isolate's requests asked since its last
 * call — admits, releases, abandons — in one message, so a busy model's
 * pool takes a few calls per round trip per isolate instead of two per
 * request.
 */
export interface Exchange {
  /** The isolate's channel: later decisions for its queued admits wait in this channel's mailbox. */
  channel: string;
  /** The newest endpoint set version the isolate has seen. */
  endpointsVersion: number;
  admits: AdmitRequest[];
  releases: { id: string; report: ReleaseReport }[];
  abandons: string[];
  /** Streams whose first token came: their prompts are computed (PoolCore.prefilled). */
  prefilled?: string[];
  /** Requests admitted from grants since the last call. */
  used?: GrantUse[];
  /** Grants given back unused (expired at the isolate, or the pool said it is in a hurry). */
  returned?: string[];
  /** Mailbox entries up to this number arrived; the pool forgets them. */
  ack: number;
  /**
   * Nothing else is wanted but the mailbox: with nothing in it, the pool
   * holds the answer until one of the channel's queued admits is decided,
   * or for `POLL_HOLD_MS`.
   */
  poll: boolean;
  /** Fail-open decisions the isolate made since its last call, for the pool's counter. */
  failOpens: number;
}

export interface ExchangeAnswer {
  /** The decisions made while the call was handled, one per admit it carried that did not queue. */
  decided: { id: string; admission: Admission }[];
  /** Decisions for the channel's admits that waited in a queue, numbered, sent until acknowledged. */
  later: { seq: number; id: string; admission: Admission }[];
  /**
   * The pool has taken calls near half of what it can a second: a channel
   * must not add calls of its own to pipeline admits (pool-channel.ts), only
   * fold them into fewer.
   */
  busy: boolean;
  /**
   * Releases and first-token notes change admission now (a band waits, or
   * saturation is at half the lowest ceiling or above): the channel sends
   * them at once instead of letting them ride with its next call. It also
   * ends the use of the channel's grants.
   */
  hurry: boolean;
  /** Slots set aside for the channel's next requests (Grant); absent when none. */
  grants?: Grant[];
}

export interface ReleaseReport {
  /** Every endpoint tried, in order, with how it went (a retry's failure opens breakers too) and, for a failure, why. */
  attempts: { endpoint: string; verdict: Verdict; reason?: string | undefined }[];
}

/** A breaker that a release opened, and why: for the pool's log. */
export interface BreakerOpened {
  endpoint: string;
  failures: number;
  reason: string;
}

export interface LoadUpdate {
  endpoint: string;
  sample: LoadSample;
}

export interface BandCounters {
  admitted: number;
  queued: number;
  full: number;
  expired: number;
  abandoned: number;
  /** Refused with 503 at once: no endpoint serves the model. */
  noEndpoints: number;
  /** Refused with 503 at once: none can take requests (breakers open, draining, down). */
  noCapacity: number;
}

export interface GrantCounters {
  issued: number;
  used: number;
  /** Used after the pool had let the slot go (the isolate told it late): charged anew. */
  late: number;
  returned: number;
  expired: number;
}

export interface EndpointStatus {
  id: string;
  /** The site that published it ("default" for a single site). */
  site: string;
  url: string;
  pool: string;
  priority: number;
  weight: number;
  state: string;
  inflight: number;
  /** Grants' slots set aside here, not in `inflight`; decisions count them as in flight. */
  reserved: number;
  /** Streams of those still waiting for their first token. */
  prefilling: number;
  /** Predicted tokens of the requests in flight (the pool's charges). */
  tokens: number;
  maxSeqs: number | null;
  kvTokens: number | null;
  saturation: number;
  breaker: BreakerState;
  /** Why the breaker opened (its last failure), while it is not closed. */
  breakerReason: string | null;
  loadAgeMs: number | null;
  waiting: number | null;
  running: number | null;
  kvUsage: number | null;
  prefixBlocks: number;
}

export interface PoolStatus {
  model: string;
  endpointsVersion: number;
  saturation: number | null;
  loadFeed: "live" | "stale" | "none";
  leases: number;
  sessions: number;
  failOpens: number;
  /** Grants set aside and not yet used or given back, and what became of those since the pool started. */
  grants: GrantCounters & { outstanding: number };
  /**
   * Calls Workers made to the pool since it started, each carrying any number
   * of admits, releases and notes (pool-channel.ts). Over the admissions, what
   * coalescing saves; per second, how near the pool is to the ~1,000 calls a
   * Durable Object takes (docs/routing.md, "Coalesced calls"). The isolate's own
   * pool that a Worker fails open to takes none.
   */
  calls: number;
  estimated: EstimatedUsage;
  bands: ({ name: string; ceiling: number; depth: number } & BandCounters)[];
  routes: Record<RouteTier, number>;
  /** Requests admitted to each site's endpoints since the pool started, by site name. */
  routedBySite: Record<string, number>;
  /** The same over the last minute (recent-counts.ts): each site's share of traffic now. */
  routedLastMinuteBySite: Record<string, number>;
  endpoints: EndpointStatus[];
  /** Why endpoints were set aside at the last decision. */
  lastRejections: Rejection[];
  /** Each site's part of the pool (the ModelPool fills it in; the core knows no versions per site). */
  sites?: SiteStatus[];
}

export interface SiteStatus {
  site: string;
  version: number;
  endpoints: number;
  loadFeed: "live" | "stale" | "none";
  /** Requests the pool admitted to this site's endpoints since it started. */
  routed: number;
  /** The same over the last minute: its share of traffic now. */
  routedLastMinute: number;
}
