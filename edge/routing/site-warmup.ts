/**
 * A site's return without a herd (docs/sites.md, "When a site comes back").
 * While a site is lost — every endpoint stale, down, or behind an open
 * breaker — its preferred traffic goes to the next site. When it comes back,
 * the requests that prefer it would all return in the same instant, onto
 * engines whose prefix caches are cold and whose load the pool has barely
 * seen. Instead its share of them grows linearly from 0 to 1 over `warmup`
 * from the moment it was seen healthy again; the site stage
 * (site-preference.ts) sends each request there with that probability.
 *
 * Pure and clock-free: the pool observes each site's health with its own
 * clock whenever it computes its candidates or takes a load update. A site
 * first seen healthy (a pool's cold start, a new site) is warm at once: the
 * ramp is for a return, not a beginning.
 */
export class SiteWarmup {
  /** Per site: healthy now, and since when (a return's start; -∞ for "always was"). */
  private readonly sites = new Map<string, { healthy: boolean; since: number }>();

  observe(site: string, healthy: boolean, now: number): void {
    const s = this.sites.get(site);
    if (!s) this.sites.set(site, { healthy, since: healthy ? Number.NEGATIVE_INFINITY : now });
    else if (healthy && !s.healthy) this.sites.set(site, { healthy, since: now });
    else if (!healthy && s.healthy) this.sites.set(site, { healthy, since: now });
  }

  /** As last observed; a site never observed is taken as healthy. */
  isHealthy(site: string): boolean {
    return this.sites.get(site)?.healthy ?? true;
  }

  /** The share of its preferred traffic `site` takes at `now`, 0..1. */
  share(site: string, now: number, warmupMs: number): number {
    const s = this.sites.get(site);
    if (!s?.healthy || warmupMs <= 0) return 1;
    return Math.min(1, Math.max(0, (now - s.since) / warmupMs));
  }

  /** Sites still growing their share, and that share (for the pool's status). */
  warming(now: number, warmupMs: number): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [site, s] of this.sites) {
      const share = this.share(site, now, warmupMs);
      if (s.healthy && share < 1) out[site] = share;
    }
    return out;
  }

  forget(site: string): void {
    this.sites.delete(site);
  }
}

/**
 * Each site's health as the pool sees it now: healthy while one of its
 * endpoints is routable and its load fresh (or never scraped: nobody scrapes
 * a router-only endpoint, and a silence that never began is no loss).
 */
export function siteHealth(
  cands: readonly { site: string; routable: boolean; stale: boolean }[],
): Map<string, boolean> {
  const out = new Map<string, boolean>();
  for (const c of cands) out.set(c.site, (out.get(c.site) ?? false) || (c.routable && !c.stale));
  return out;
}
