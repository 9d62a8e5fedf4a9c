import type { EdgeSyncClient } from "../../common/edgesync-client.ts";

/**
 * The edge's sites as `npm start` finds and leaves them. The edge keeps its
 * KV in the state directory across starts, so a start with another
 * `--sites` than the last would find the last one's endpoint sets still
 * there, the same engines in the union under two names (docs/sites.md):
 * the sets of sites this start does not run are emptied first, as an
 * operator retires a site.
 */
export async function retireOtherSites(edge: EdgeSyncClient, running: readonly string[]): Promise<string[]> {
  const { pools } = await edge.getPoolStatus({}, { timeoutMs: 10_000 });
  const others = new Set<string>();
  for (const p of pools)
    for (const s of p.sites) if (s.endpoints > 0 && !running.includes(s.site)) others.add(s.site);
  for (const site of others)
    await edge.putEndpointSets({ site: site === "default" ? "" : site, endpoints: [], allowEmpty: true });
  return [...others];
}

/**
 * Null once every model's pool has a ready endpoint of every site, else
 * what is still awaited: with several sites, "up" means each serves.
 */
export async function sitesAwaiting(edge: EdgeSyncClient, sites: readonly string[]): Promise<string | null> {
  const { pools } = await edge.getPoolStatus({}, { timeoutMs: 5_000 });
  for (const p of pools) {
    if (p.error) return `${p.model}'s pool at the edge: ${p.error}`;
    if (p.endpoints.length === 0) continue; // a model no site runs, as a retired site leaves it
    for (const site of sites) {
      if (!p.endpoints.some((e) => e.site === site && e.state === "ready"))
        return `${p.model}: a ready endpoint of ${site} in its pool at the edge`;
    }
  }
  return null;
}
