/**
 * `router.sites` (docs/sites.md, "Preference by location"): which site a
 * request prefers, by where it entered Cloudflare, and how a site that
 * comes back takes its traffic back. The operator's map, not a latency
 * table the edge measures: the edge sees where a request came from, not
 * the network between that place and each site's GPUs.
 */
import { z } from "zod";
import { durationWithin } from "../../common/duration.ts";
import { siteNameSchema } from "./site-name.ts";

/** Cloudflare's `request.cf.continent` codes. */
export const CONTINENTS = ["AF", "AN", "AS", "EU", "NA", "OC", "SA"] as const;

/** An ordered preference: the first site that can take the request gets it. */
const sites = z
  .array(siteNameSchema)
  .refine((list) => new Set(list).size === list.length, "a site is named twice");
const siteOrder = sites.min(1);

export const routerSitesSchema = z.strictObject({
  // The order for a request whose location no entry below names (or that
  // has none). Empty: such requests prefer no site.
  order: sites.default([]),
  // By `request.cf.continent` (EU, NA, …), `country` (ISO 3166 alpha-2) and
  // `colo` (the IATA code of the Cloudflare data centre): the most specific
  // entry that names the request's location wins (colo, country, continent).
  continents: z
    .record(z.string().regex(/^(AF|AN|AS|EU|NA|OC|SA)$/, `one of ${CONTINENTS.join(", ")}`), siteOrder)
    .default({}),
  countries: z
    .record(z.string().regex(/^[A-Z]{2}$/, "two upper-case letters (ISO 3166)"), siteOrder)
    .default({}),
  colos: z.record(z.string().regex(/^[A-Z]{3}$/, "three upper-case letters (IATA)"), siteOrder).default({}),
  // How long a site that comes back (fresh load after stale, a routable
  // endpoint after every breaker was open) takes to grow from no share of
  // its preferred traffic to all of it, linearly. 0s: all at once.
  warmup: durationWithin("0s", "24h").prefault("30s"),
});

export type RouterSitesConfig = z.output<typeof routerSitesSchema>;
