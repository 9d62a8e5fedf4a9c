import { shareText, siteRows } from "../common/site-shares.ts";
import type { EdgeModel } from "../proto/gen/control/v1/control_pb.ts";
import type { PoolStatus } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { type Control, errorText } from "./client.ts";
import { alignHistory } from "./edge-series.ts";
import { count, duration, percent } from "./format.ts";
import { Plot } from "./plot.tsx";
import { usePoll } from "./poll.ts";

// The control plane polls the edge every edge.status_interval (5 s by
// default); reading its copy every 2 s shows each new poll promptly.
const EDGE_POLL_MS = 2_000;

const saturationText = (s: number) => (s < 0 ? "no routable endpoint" : percent(s));

/**
 * The model's sites (docs/sites.md): each one's health and share of the
 * requests the pool routed. Nothing for an edge of one site, or one whose
 * status has no sites; an edge that counts no routed requests per site
 * shows no share ("-").
 */
function Sites({ p }: { p: PoolStatus }) {
  const rows = siteRows([p]);
  if (rows.length === 0) return null;
  return (
    <table class="sites">
      <thead>
        <tr>
          <th>Site</th>
          <th>Endpoint set</th>
          <th>Endpoints ready</th>
          <th title="live: the site's control plane pushes load; stale: it stopped, and its endpoints decay toward saturation 1">
            Load feed
          </th>
          <th>Routed</th>
          <th title="the requests routed to the site in the last minute, over every site's">
            Share of traffic (last minute)
          </th>
        </tr>
      </thead>
      <tbody>
        {rows.map((r) => (
          <tr key={r.site} data-site={r.site}>
            <td class="name">{r.site}</td>
            <td>v{r.version}</td>
            <td>
              {r.ready} of {r.endpoints}
            </td>
            <td>
              <span class={`state feed-${r.loadFeed || "unknown"}`}>{r.loadFeed || "unknown"}</span>
            </td>
            <td>
              {count(r.routed)} <span class="sub">({count(r.routedLastMinute)} in the last minute)</span>
            </td>
            <td data-share>{shareText(r.share)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function Pool({ m }: { m: EdgeModel }) {
  const p: PoolStatus | undefined = m.pool;
  if (!p) return null;
  const routes = Object.entries(p.routes).filter(([, n]) => n > 0n);
  return (
    <div class="pool" data-pool={m.model}>
      <h3>
        {m.model}{" "}
        <span class="sub">
          endpoint set v{String(p.endpointsVersion)} · reported {duration(Number(m.ageMs))} ago · load feed{" "}
          {p.loadFeed}
        </span>
      </h3>
      {p.error ? <p class="error">The pool did not answer: {p.error}</p> : null}
      <p>
        Saturation <b data-saturation>{saturationText(p.saturation)}</b> · picks by tier:{" "}
        {routes.length === 0 ? "none yet" : routes.map(([tier, n]) => `${tier} ${count(n)}`).join(", ")}
        {p.calls > 0n ? ` · ${count(p.calls)} pool calls` : ""}
        {p.failOpens > 0n ? ` · ${count(p.failOpens)} fail-opens` : ""}
      </p>
      <Sites p={p} />
      <table>
        <thead>
          <tr>
            <th>Band</th>
            <th>Queued now</th>
            <th>Admitted</th>
            <th>Were queued</th>
            <th>Shed: queue full (429)</th>
            <th>Shed: expired (503)</th>
            <th>Left while queued</th>
            <th title="Refused at once: no endpoint serves the model">Refused: no endpoint (503)</th>
            <th title="Refused at once: no endpoint can take requests (breakers open, draining, down)">
              Refused: no capacity (503)
            </th>
          </tr>
        </thead>
        <tbody>
          {p.bands.map((b) => (
            <tr key={b.name} data-band={b.name}>
              <td class="name">
                {b.name} <span class="sub">ceiling {percent(b.ceiling)}</span>
              </td>
              <td>{b.depth}</td>
              <td>{count(b.admitted)}</td>
              <td>{count(b.queued)}</td>
              <td>{count(b.full)}</td>
              <td>{count(b.expired)}</td>
              <td>{count(b.abandoned)}</td>
              <td>{count(b.noEndpoints)}</td>
              <td>{count(b.noCapacity)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {p.endpoints.length === 0 ? <p class="empty">No endpoint is published for this model.</p> : null}
      <table hidden={p.endpoints.length === 0}>
        <thead>
          <tr>
            <th>Endpoint</th>
            <th>State</th>
            <th>Breaker</th>
            <th>In flight</th>
            <th>Engine load</th>
          </tr>
        </thead>
        <tbody>
          {p.endpoints.map((e) => (
            <tr key={e.id} data-endpoint={e.id}>
              <td class="name">
                {e.id}
                <div class="sub">{e.url}</div>
              </td>
              <td>
                <span class={`state state-${e.state}`}>{e.state}</span>
              </td>
              <td>
                <span class={`state breaker-${e.breaker}`}>{e.breaker}</span>
              </td>
              <td>{e.inflight}</td>
              <td>
                {e.loadAgeMs < 0n
                  ? "never scraped"
                  : `${e.waiting} waiting · ${e.running} running · KV ${percent(e.kvUsage)} · saturation ${percent(e.saturation)}`}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function Edge({ client }: { client: Control }) {
  const { data, error } = usePoll(() => client.getEdgeStatus({}), EDGE_POLL_MS);
  const models = data?.models ?? [];
  const names = models.map((m) => m.model);
  return (
    <section id="edge">
      <h2>Edge</h2>
      {error ? <p class="error">Edge status: {errorText(error)}</p> : null}
      {data && !data.configured ? (
        <p class="empty">
          This control plane has no edge link (edge.url and the EdgeSync secret), so it has no view of the
          edge.
        </p>
      ) : null}
      {data?.configured ? (
        <>
          <p class="sub">
            {data.edgeUrl}, polled every {duration(data.pollIntervalMs)}
            {data.lastSuccessAtUnixMs > 0n
              ? `, last answer ${duration(Date.now() - Number(data.lastSuccessAtUnixMs))} ago`
              : ", no answer yet"}
          </p>
          {data.lastError ? <p class="error">Last poll failed: {data.lastError}</p> : null}
          {models.length > 0 ? (
            <div class="plots">
              <Plot
                title="Saturation, last 15 minutes"
                names={names}
                data={alignHistory(models, "saturation")}
                yRange={[0, 1]}
              />
              <Plot title="Queued requests (all bands)" names={names} data={alignHistory(models, "queue")} />
              <Plot title="Generated tokens per second" names={names} data={alignHistory(models, "tokens")} />
            </div>
          ) : null}
          {models.map((m) => (
            <Pool key={m.model} m={m} />
          ))}
        </>
      ) : null}
    </section>
  );
}
