import type { EndpointRecord, EndpointsDoc } from "./catalog.ts";

/**
 * Sites (docs/sites.md): each control plane publishes the endpoint set of
 * its own site, versioned on its own, so a slow site never rolls back a
 * fast one; the pools route over the union. Pure: the edge's KV reader,
 * EdgeSync and the ModelPool all merge with these functions.
 */

/** The site of a deployment that names none: its sets and ids are what they were before sites. */
export const DEFAULT_SITE = "default";

export { siteNameSchema } from "./site-name.ts";

/**
 * An endpoint's id in the union. Two sites running the same profile of one
 * model give their replicas the same ids, so every site but the default
 * one has its name appended; the default site's ids stay as they were.
 */
export function qualifiedId(site: string, id: string): string {
  return site === DEFAULT_SITE ? id : `${id}@${site}`;
}

/** Each site's set, by site name. */
export type SiteSets = ReadonlyMap<string, EndpointsDoc>;

/** A record of the union: the site's record under its qualified id, and the site it came from. */
export type SiteEndpointRecord = EndpointRecord & { site: string };

/**
 * The union of every site's set, sites in name order. Its version is the sum
 * of the sites' versions: each only grows, so the sum grows with every new
 * set of any site, which is all a Worker's hint to its pool needs.
 */
export function unionOf(sets: SiteSets): { version: number; endpoints: SiteEndpointRecord[] } {
  let version = 0;
  const endpoints: SiteEndpointRecord[] = [];
  for (const site of [...sets.keys()].sort()) {
    const doc = sets.get(site)!;
    version += doc.version;
    for (const e of doc.endpoints) endpoints.push({ ...e, id: qualifiedId(site, e.id), site });
  }
  return { version, endpoints };
}

/**
 * Takes `doc` as `site`'s set when it is newer than the one held: an older
 * one (a stale KV read, a push overtaken by another) changes nothing.
 * Whether anything changed.
 */
export function mergeSite<D extends { version: number }>(
  held: Map<string, D>,
  site: string,
  doc: D,
): boolean {
  const had = held.get(site);
  if (had && had.version >= doc.version) return false;
  held.set(site, doc);
  return true;
}

/**
 * Ids `site`'s new set would share with another site's endpoints in the
 * union (a default-site id that happens to end in `@eu`): the index in the
 * new set and the message for each, so EdgeSync can refuse the set.
 */
export function idCollisions(
  sets: SiteSets,
  site: string,
  endpoints: readonly { id: string }[],
): { index: number; message: string }[] {
  const others = new Map<string, string>();
  for (const [s, doc] of sets) {
    if (s === site) continue;
    for (const e of doc.endpoints) others.set(qualifiedId(s, e.id), s);
  }
  const out: { index: number; message: string }[] = [];
  endpoints.forEach((e, index) => {
    const id = qualifiedId(site, e.id);
    const owner = others.get(id);
    if (owner !== undefined)
      out.push({ index, message: `"${id}" is already an endpoint of site "${owner}"` });
  });
  return out;
}

/**
 * One model's endpoints as its pool holds them: each site's part at that
 * site's version, merged so an older part never replaces a newer one.
 */
export class SiteParts<T> {
  private readonly parts = new Map<string, { version: number; endpoints: readonly T[] }>();

  /** Whether the union changed. */
  set(site: string, version: number, endpoints: readonly T[]): boolean {
    return mergeSite(this.parts, site, { version, endpoints });
  }

  versionOf(site: string): number {
    return this.parts.get(site)?.version ?? 0;
  }

  /** The sum of the parts' versions: grows with every part taken. */
  get version(): number {
    let v = 0;
    for (const p of this.parts.values()) v += p.version;
    return v;
  }

  union(): T[] {
    return [...this.parts.keys()].sort().flatMap((s) => this.parts.get(s)!.endpoints);
  }

  /** Each site's version and how many endpoints it gives this model. */
  sites(): { site: string; version: number; endpoints: number }[] {
    return [...this.parts.keys()].sort().map((site) => {
      const p = this.parts.get(site)!;
      return { site, version: p.version, endpoints: p.endpoints.length };
    });
  }
}

export type LoadFeed = "live" | "stale" | "none";

/**
 * A site's load feed as its endpoints' last samples show it: live while any
 * is younger than `staleMs`, none when none was ever scraped. A site whose
 * control plane stopped pushing goes stale like one engine does, and its
 * endpoints' scraped signals decay toward saturation 1 (routing/saturation.ts).
 */
export function siteFeeds(
  endpoints: readonly { site: string; loadAgeMs: number | null }[],
  staleMs: number,
): Map<string, LoadFeed> {
  const out = new Map<string, LoadFeed>();
  for (const e of endpoints) {
    const was = out.get(e.site) ?? "none";
    const now: LoadFeed = e.loadAgeMs === null ? "none" : e.loadAgeMs <= staleMs ? "live" : "stale";
    const rank = { none: 0, stale: 1, live: 2 };
    out.set(e.site, rank[now] > rank[was] ? now : was);
  }
  return out;
}
