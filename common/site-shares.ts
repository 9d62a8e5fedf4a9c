import type { PoolStatus } from "../proto/gen/edge/v1/edgesync_pb.ts";

/**
 * Each site's part of each model's pool at the edge (docs/sites.md): its
 * health — the endpoint set version the pool holds, its endpoints and how
 * many are ready, its load feed — and its share of the model's traffic:
 * the requests the pool admitted to its endpoints over the last minute,
 * beside the count since the pool started (a lifetime share still reads as
 * before a site's loss long after it). `ctl status` prints them
 * as its SITES table and carries them in `--json`; the dashboard shows them
 * under each model's pool.
 */
export interface SiteRow {
  model: string;
  site: string;
  version: number;
  endpoints: number;
  ready: number;
  loadFeed: string;
  routed: number;
  routedLastMinute: number;
  /** routedLastMinute over the model's requests routed to every site in the last minute, 0..1; null if none was. */
  share: number | null;
}

/** The rows of the pools that name a site other than the default one: a single-site edge has none. */
export function siteRows(pools: readonly PoolStatus[]): SiteRow[] {
  const rows: SiteRow[] = [];
  for (const p of pools) {
    if (!p.sites.some((s) => s.site !== "default")) continue;
    const total = p.sites.reduce((sum, s) => sum + Number(s.routedLastMinute), 0);
    for (const s of p.sites) {
      const mine = p.endpoints.filter((e) => e.site === s.site);
      rows.push({
        model: p.model,
        site: s.site,
        version: Number(s.version),
        endpoints: s.endpoints,
        ready: mine.filter((e) => e.state === "ready").length,
        loadFeed: s.loadFeed,
        routed: Number(s.routed),
        routedLastMinute: Number(s.routedLastMinute),
        share: total > 0 ? Number(s.routedLastMinute) / total : null,
      });
    }
  }
  return rows;
}

export const shareText = (share: number | null) => (share === null ? "-" : `${Math.round(share * 100)}%`);
