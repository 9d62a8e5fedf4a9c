/**
 * The site stage of picking (docs/routing.md, "Picking"; docs/sites.md):
 * between "routable" and spill-over, it keeps the endpoints of the site
 * nearest the request that can take it, by the operator's `router.sites`
 * map from the request's location to an ordered preference.
 *
 * A site can take a request when one of its routable endpoints is under
 * saturation 1, the test spill-over applies to a spill group; a stale site's
 * endpoints have decayed to 1 and so cannot. A site that came back within
 * `warmup` takes only its growing share of the requests that prefer it
 * (site-warmup.ts), the rest go on down the order, so its engines are not
 * handed every request that was elsewhere at once. Sites a request's order
 * does not name rank after those it does, equal among themselves; with no
 * order at all every site ranks equal, and the stage only sets warming sites
 * aside. When no site can take the request, it keeps them all: flow control
 * admitted it, and spill-over and the load tier choose among what is left.
 *
 * Session and prefix affinity then act among the endpoints kept, so they
 * stay within the chosen site: a session pinned to a site that is saturated,
 * stale or less preferred than one that can take it moves.
 */
import type { RouterSitesConfig } from "../config/router-sites.ts";
import type { Candidate, Filtered } from "./candidate.ts";
import type { Location } from "./types.ts";

/** A request's preference and what it came from (for the rejections' wording). */
export interface SiteOrder {
  sites: readonly string[];
  /** "EU", "country DE", "colo FRA", "the default order". */
  basis: string;
}

export const NO_ORDER: SiteOrder = { sites: [], basis: "no preference" };

/** The most specific entry naming the request's location: colo, country, continent; then `order`. */
export function preferredSites(cfg: RouterSitesConfig, loc: Location | undefined): SiteOrder {
  if (loc?.colo && cfg.colos[loc.colo]) return { sites: cfg.colos[loc.colo]!, basis: `colo ${loc.colo}` };
  if (loc?.country && cfg.countries[loc.country])
    return { sites: cfg.countries[loc.country]!, basis: `country ${loc.country}` };
  if (loc?.continent && cfg.continents[loc.continent])
    return { sites: cfg.continents[loc.continent]!, basis: `continent ${loc.continent}` };
  return cfg.order.length > 0 ? { sites: cfg.order, basis: "the default order" } : NO_ORDER;
}

export interface SiteStageContext {
  order: SiteOrder;
  /** The share of its preferred traffic a site takes now: 1 unless it came back within `warmup`. */
  warmShare: (site: string) => number;
  /**
   * A site with no routable endpoint whose load is fresh (site-warmup.ts
   * siteHealth) takes nothing while another site can: its stale endpoints'
   * saturation is still decaying toward 1 for another `stale_after`.
   */
  healthy: (site: string) => boolean;
  /** The site of the endpoint the request's session is pinned to: it stays there while it may. */
  sessionSite: string | undefined;
  random: () => number;
}

export const siteOf = (c: Candidate): string => c.spec.site ?? "default";

function rankOf(order: readonly string[], site: string): number {
  const i = order.indexOf(site);
  return i < 0 ? order.length : i;
}

const pct = (share: number) => `${Math.round(share * 100)} %`;

/** Which sites keep the request, and why each other site was set aside. */
function chooseSites(
  bySite: ReadonlyMap<string, Candidate[]>,
  ctx: SiteStageContext,
): { kept: Set<string>; why: Map<string, string> } {
  const order = ctx.order.sites;
  const sites = [...bySite.keys()].sort((a, b) => rankOf(order, a) - rankOf(order, b) || (a < b ? -1 : 1));
  const why = new Map<string, string>();
  const able = (s: string) => ctx.healthy(s) && bySite.get(s)!.some((c) => c.saturation < 1);
  let fallback: Set<string> | undefined;
  for (let i = 0; i < sites.length; ) {
    const rank = rankOf(order, sites[i]!);
    const tier: string[] = [];
    while (i < sites.length && rankOf(order, sites[i]!) === rank) tier.push(sites[i++]!);
    const passing = new Set<string>();
    const ready = tier.filter(able);
    for (const s of tier) {
      if (!ready.includes(s)) {
        why.set(
          s,
          ctx.healthy(s)
            ? `site ${s} is saturated`
            : `site ${s} is lost (no routable endpoint with fresh load)`,
        );
        continue;
      }
      const share = ctx.warmShare(s);
      if (share >= 1 || s === ctx.sessionSite || ctx.random() < share) passing.add(s);
      else why.set(s, `site ${s} came back and is warming up (${pct(share)} of its traffic)`);
    }
    if (passing.size > 0) {
      const chosen = [...passing].join(", ");
      for (const s of sites.slice(i))
        why.set(
          s,
          `site ${s} waits while site ${chosen}, preferred for ${ctx.order.basis}, can take requests`,
        );
      return { kept: passing, why };
    }
    if (ready.length > 0) fallback ??= new Set(ready);
  }
  // Every able site is warming and lost the draw: the nearest of them takes it anyway.
  if (fallback) {
    for (const s of fallback) why.delete(s);
    return { kept: fallback, why };
  }
  // No site can take it: flow control admitted it, so the healthy sites (all, if none is) share it.
  const healthy = sites.filter(ctx.healthy);
  if (healthy.length === 0 || healthy.length === sites.length)
    return { kept: new Set(sites), why: new Map() };
  for (const s of healthy) why.delete(s);
  return { kept: new Set(healthy), why };
}

/** The site stage: keeps the endpoints of the nearest site that can take the request. */
export function sitePreference(cands: readonly Candidate[], ctx: SiteStageContext): Filtered {
  const bySite = new Map<string, Candidate[]>();
  for (const c of cands) {
    const list = bySite.get(siteOf(c));
    if (list) list.push(c);
    else bySite.set(siteOf(c), [c]);
  }
  if (bySite.size <= 1) return { kept: [...cands], rejected: [] };
  const { kept, why } = chooseSites(bySite, ctx);
  const out: Filtered = { kept: [], rejected: [] };
  for (const c of cands) {
    const s = siteOf(c);
    if (kept.has(s)) out.kept.push(c);
    else
      out.rejected.push({ endpoint: c.spec.id, stage: "site", reason: why.get(s) ?? `site ${s} set aside` });
  }
  return out;
}

/**
 * Alternates for retries, taken in turn from each site (the chosen one's
 * first, then by preference), each site's own in the order given: a site
 * lost whole refuses every connection, so a retry that stays there is
 * wasted, while one engine's failure is best retried beside it.
 */
export function interleaveBySite(
  ranked: readonly Candidate[],
  first: string,
  order: readonly string[],
): Candidate[] {
  const bySite = new Map<string, Candidate[]>();
  for (const c of ranked) {
    const list = bySite.get(siteOf(c));
    if (list) list.push(c);
    else bySite.set(siteOf(c), [c]);
  }
  if (bySite.size <= 1) return [...ranked];
  const sites = [...bySite.keys()].sort(
    (a, b) => Number(b === first) - Number(a === first) || rankOf(order, a) - rankOf(order, b),
  );
  const out: Candidate[] = [];
  for (let k = 0; out.length < ranked.length; k++) {
    for (const s of sites) {
      const c = bySite.get(s)![k];
      if (c) out.push(c);
    }
  }
  return out;
}
