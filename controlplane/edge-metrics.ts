/**
 * The edge's live state as `llmgw_edge_*`, from what the status poller last
 * received, so one scrape of the control plane sees the whole system
 * (docs/metrics.md). The counters are the pools' own: a pool's Durable
 * Object that restarts counts from zero again, which Prometheus's rate()
 * reads as a counter reset. Labels stay bounded: model, band, route tier,
 * breaker state and outcome come from the catalog and the router's fixed
 * vocabularies, site from the sites that publish, never from requests.
 */
import type { MetricsRegistry, Sample } from "../common/prometheus.ts";
import type { PoolStatus } from "../proto/gen/edge/v1/edgesync_pb.ts";
import type { EdgeStatusBook } from "./edge-status.ts";

export const BREAKER_STATES = ["closed", "open", "half-open"] as const;
export const LOAD_FEEDS = ["live", "stale", "none"] as const;
export const REQUEST_OUTCOMES = [
  "admitted",
  "full",
  "expired",
  "abandoned",
  "noEndpoints",
  "noCapacity",
] as const;

/** The outcome label of each band counter. */
const OUTCOME_LABEL: Record<(typeof REQUEST_OUTCOMES)[number], string> = {
  admitted: "admitted",
  full: "full",
  expired: "expired",
  abandoned: "abandoned",
  noEndpoints: "no_endpoints",
  noCapacity: "no_capacity",
};

export function registerEdgeMetrics(metrics: MetricsRegistry, book: EdgeStatusBook, now: () => number): void {
  // A pool that did not answer has no figures; its model shows in llmgw_edge_pool_up alone.
  const answered = () => book.pools().filter((p) => !p.error);
  const views: PoolViews = {
    answered,
    perModel: (value) => () =>
      answered().flatMap((p) => {
        const v = value(p);
        return v === undefined ? [] : [{ labels: { model: p.model }, value: v }];
      }),
    perBand: (value) => () =>
      answered().flatMap((p) =>
        p.bands.map((b) => ({ labels: { model: p.model, band: b.name }, value: value(b) })),
      ),
  };
  registerAdmissionMetrics(metrics, book, views);
  registerRoutingMetrics(metrics, views);
  registerPollMetrics(metrics, book, now);
}

/** The pools that answered the last poll, and samples of one figure per model or per band of them. */
interface PoolViews {
  answered: () => PoolStatus[];
  perModel: (value: (p: PoolStatus) => number | undefined) => () => Sample[];
  perBand: (value: (b: PoolStatus["bands"][number]) => number) => () => Sample[];
}

/** Whether each pool answered, its saturation, and its band queues and their outcomes. */
function registerAdmissionMetrics(
  metrics: MetricsRegistry,
  book: EdgeStatusBook,
  { answered, perModel, perBand }: PoolViews,
): void {
  metrics.gauge(
    "llmgw_edge_pool_up",
    "1 when the model's pool at the edge answered the last poll, 0 when it did not.",
    () => book.pools().map((p) => ({ labels: { model: p.model }, value: p.error ? 0 : 1 })),
  );
  metrics.gauge(
    "llmgw_edge_saturation",
    "The pool's saturation, 0 to 1 (the routable endpoints' load); absent while no endpoint is routable.",
    perModel((p) => (p.saturation >= 0 ? p.saturation : undefined)),
  );
  metrics.gauge(
    "llmgw_edge_queue_depth",
    "Requests waiting in the band's queue.",
    perBand((b) => b.depth),
  );
  metrics.counter(
    "llmgw_edge_requests_total",
    "Requests by how admission ended: admitted, full (429, queue full), expired (503, queue_ttl), abandoned (client left while queued), no_endpoints and no_capacity (503 at once: no endpoint serves the model, or none can take requests, e.g. every breaker open). Fail-opens: llmgw_edge_fail_opens_total.",
    () =>
      answered().flatMap((p) =>
        p.bands.flatMap((b) =>
          REQUEST_OUTCOMES.map((outcome) => ({
            labels: { model: p.model, band: b.name, outcome: OUTCOME_LABEL[outcome] },
            value: Number(b[outcome]),
          })),
        ),
      ),
  );
  metrics.counter(
    "llmgw_edge_queued_total",
    "Requests that waited in the band's queue (each then admitted, expired or abandoned).",
    perBand((b) => Number(b.queued)),
  );
}

/** How the pools routed: picks per tier, breakers, endpoints, leases, fail-opens and estimated usage. */
function registerRoutingMetrics(metrics: MetricsRegistry, { answered, perModel }: PoolViews): void {
  metrics.counter("llmgw_edge_route_decisions_total", "Picks by the tier that decided them.", () =>
    answered().flatMap((p) =>
      Object.entries(p.routes).map(([tier, n]) => ({ labels: { model: p.model, tier }, value: Number(n) })),
    ),
  );
  metrics.gauge("llmgw_edge_breakers", "The pool's endpoints by circuit-breaker state.", () =>
    answered().flatMap((p) =>
      BREAKER_STATES.map((state) => ({
        labels: { model: p.model, state },
        value: p.endpoints.filter((e) => e.breaker === state).length,
      })),
    ),
  );
  metrics.gauge(
    "llmgw_edge_endpoints",
    "Endpoints in the model's pool.",
    perModel((p) => p.endpoints.length),
  );
  // Per site (docs/sites.md): bounded by the sites that publish, as the model label is by the catalog.
  const perSite = (value: (p: PoolStatus, site: string) => number) => (): Sample[] =>
    answered().flatMap((p) =>
      p.sites.map((s) => ({ labels: { model: p.model, site: s.site }, value: value(p, s.site) })),
    );
  metrics.gauge(
    "llmgw_edge_site_endpoints",
    "Endpoints each site gives the model's pool.",
    perSite((p, site) => p.endpoints.filter((e) => e.site === site).length),
  );
  metrics.gauge(
    "llmgw_edge_site_inflight_requests",
    "Requests in flight on each site's endpoints: the site's share of the model's traffic now.",
    perSite((p, site) => p.endpoints.filter((e) => e.site === site).reduce((n, e) => n + e.inflight, 0)),
  );
  metrics.counter(
    "llmgw_edge_site_routed_requests_total",
    "Requests the pool routed to each site's endpoints since it started: the sites' shares of the model's traffic.",
    perSite((p, site) => Number(p.sites.find((s) => s.site === site)?.routed ?? 0n)),
  );
  metrics.gauge(
    "llmgw_edge_site_load_feed",
    "1 for the state of each site's load feed (live, stale: its control plane stopped pushing, none: never scraped), 0 for the others.",
    () =>
      answered().flatMap((p) =>
        p.sites.flatMap((s) =>
          LOAD_FEEDS.map((feed) => ({
            labels: { model: p.model, site: s.site, feed },
            value: s.loadFeed === feed ? 1 : 0,
          })),
        ),
      ),
  );
  metrics.gauge(
    "llmgw_edge_inflight_requests",
    "Requests the pool has admitted and not yet released.",
    perModel((p) => p.leases),
  );
  metrics.gauge(
    "llmgw_edge_endpoint_set_version",
    "Version of the endpoint set the pool routes with.",
    perModel((p) => Number(p.endpointsVersion)),
  );
  metrics.counter(
    "llmgw_edge_fail_opens_total",
    "Requests Workers routed on their own because the pool did not answer.",
    perModel((p) => Number(p.failOpens)),
  );
  metrics.counter(
    "llmgw_edge_pool_calls_total",
    "Calls Workers made to the model's pool, each carrying any number of admits, releases and notes (one Durable Object takes about 1,000 a second).",
    perModel((p) => Number(p.calls)),
  );
  metrics.counter(
    "llmgw_edge_estimated_requests_total",
    "Requests charged the edge's usage estimate because the engine reported no usage.",
    perModel((p) => Number(p.estimatedRequests)),
  );
  metrics.counter(
    "llmgw_edge_estimated_tokens_total",
    "Tokens (prompt and completion) of the requests charged the edge's usage estimate.",
    perModel((p) => Number(p.estimatedTokens)),
  );
}

/** How fresh the control plane's view of the edge is. */
function registerPollMetrics(metrics: MetricsRegistry, book: EdgeStatusBook, now: () => number): void {
  metrics.gauge(
    "llmgw_edge_status_age_seconds",
    "Time since the last successful poll of the edge's status; absent before the first.",
    () => {
      const age = book.ageMs(now());
      return age === undefined ? [] : [{ value: age / 1000 }];
    },
  );
  metrics.counter(
    "llmgw_edge_status_poll_errors_total",
    "Polls of the edge's status that failed.",
    () => book.pollErrors,
  );
}
