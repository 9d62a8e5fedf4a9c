/**
 * How an attempt reaches an endpoint, with its engine's key from the
 * routing table (RoutingTable.engineKeyOf, by the id the lease names: a
 * site's endpoint under `id@site`).
 *
 * The lease comes from the model's pool, which EdgeSync hands a new
 * endpoint set at once, while the isolate's copy of the set may be a few
 * seconds older (config/store.ts): an endpoint the copy does not have yet
 * is looked up in a fresh read, so a replica just added is not sent without
 * its key and refused. One the fresh read has not either (KV not caught up
 * yet, or an endpoint just removed) goes without a key.
 */
import type { RoutingTable } from "../config/catalog.ts";
import { type ConfigEnv, cachedEdgeConfig, edgeConfig, invalidateEdgeConfig } from "../config/store.ts";
import type { EndpointSpec } from "../routing/types.ts";
import { type UpstreamEnv, type UpstreamFetch, upstreamFor } from "./upstream.ts";

/**
 * The table's own endpoints, every request but those just added, cost two
 * map lookups and no await. `direct` as for upstreamFor.
 */
export function keyedUpstream(
  env: ConfigEnv & UpstreamEnv,
  table: RoutingTable,
  ep: EndpointSpec,
  direct?: UpstreamFetch,
): UpstreamFetch {
  if (table.hasEndpoint(ep.id)) return upstreamFor(ep, env, table.engineKeyOf(ep.id), direct);
  return async (url, init) => {
    // The copy is dropped only if it is still the one this request began with: a newer one is used as it is.
    if (cachedEdgeConfig()?.table === table) invalidateEdgeConfig();
    const fresh = await edgeConfig(env);
    return upstreamFor(ep, env, fresh.table.engineKeyOf(ep.id), direct)(url, init);
  };
}
