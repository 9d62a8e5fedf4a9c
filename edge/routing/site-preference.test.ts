import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSitesSchema } from "../config/router-sites.ts";
import type { Candidate } from "./picker.ts";
import { plainEndpoint } from "./plain-endpoint.ts";
import { interleaveBySite, NO_ORDER, preferredSites, sitePreference } from "./site-preference.ts";

function cand(id: string, site: string, saturation = 0): Candidate {
  return {
    spec: plainEndpoint(id, { site }),
    state: "ready",
    breaker: "closed",
    probing: false,
    saturation,
    pressure: 0,
    lastPick: 0,
  };
}

const cfg = routerSitesSchema.parse({
  order: ["us", "eu"],
  continents: { EU: ["eu", "us"], NA: ["us", "eu"] },
  countries: { GB: ["uk", "eu", "us"] },
  colos: { DUB: ["uk", "us"] },
});

const ctx = (
  sites: readonly string[],
  extra: { share?: Record<string, number>; session?: string; lost?: string[] } = {},
) => ({
  order: { sites, basis: "continent EU" },
  warmShare: (s: string) => extra.share?.[s] ?? 1,
  healthy: (s: string) => !extra.lost?.includes(s),
  sessionSite: extra.session,
  random: mulberry32(1),
});

const ids = (cs: readonly Candidate[]) => cs.map((c) => c.spec.id);

describe("a request's site preference", () => {
  it("takes the most specific entry naming its location: colo, then country, then continent, then the default order", () => {
    expect(preferredSites(cfg, { continent: "EU", country: "GB", colo: "DUB" }).sites).toEqual(["uk", "us"]);
    expect(preferredSites(cfg, { continent: "EU", country: "GB", colo: "LHR" }).sites).toEqual([
      "uk",
      "eu",
      "us",
    ]);
    expect(preferredSites(cfg, { continent: "EU", country: "DE" })).toEqual({
      sites: ["eu", "us"],
      basis: "continent EU",
    });
    expect(preferredSites(cfg, { continent: "AS" }).basis).toBe("the default order");
    expect(preferredSites(cfg, undefined).sites).toEqual(["us", "eu"]);
    expect(preferredSites(routerSitesSchema.parse({}), { continent: "EU" })).toBe(NO_ORDER);
  });

  it("refuses a continent Cloudflare does not name, and a site twice in one order", () => {
    expect(routerSitesSchema.safeParse({ continents: { EUROPE: ["eu"] } }).success).toBe(false);
    expect(routerSitesSchema.safeParse({ order: ["eu", "eu"] }).success).toBe(false);
    expect(routerSitesSchema.safeParse({ continents: { EU: ["eu", "eu"] } }).success).toBe(false);
  });
});

describe("the site stage", () => {
  const fleet = [cand("a0@eu", "eu"), cand("a1@eu", "eu"), cand("b0@us", "us"), cand("b1@us", "us")];

  it("keeps the nearest site's endpoints and says why it set the others aside", () => {
    const r = sitePreference(fleet, ctx(["eu", "us"]));
    expect(ids(r.kept)).toEqual(["a0@eu", "a1@eu"]);
    expect(r.rejected).toEqual([
      {
        endpoint: "b0@us",
        stage: "site",
        reason: "site us waits while site eu, preferred for continent EU, can take requests",
      },
      {
        endpoint: "b1@us",
        stage: "site",
        reason: "site us waits while site eu, preferred for continent EU, can take requests",
      },
    ]);
  });

  it("spills to the next site when every endpoint of the nearest is saturated or stale, as spill groups do", () => {
    const full = [cand("a0@eu", "eu", 1), cand("a1@eu", "eu", 1.2), cand("b0@us", "us", 0.5)];
    const r = sitePreference(full, ctx(["eu", "us"]));
    expect(ids(r.kept)).toEqual(["b0@us"]);
    expect(r.rejected[0]!.reason).toBe("site eu is saturated");
  });

  it("passes over a lost site while its stale endpoints' saturation is still decaying toward 1", () => {
    const r = sitePreference(fleet, ctx(["eu", "us"], { lost: ["eu"] }));
    expect(ids(r.kept)).toEqual(["b0@us", "b1@us"]);
    expect(r.rejected[0]!.reason).toBe("site eu is lost (no routable endpoint with fresh load)");
    // Nothing can take it: the healthy sites share it, not the lost one.
    const full = [cand("a0@eu", "eu", 0.5), cand("b0@us", "us", 1)];
    expect(ids(sitePreference(full, ctx(["eu", "us"], { lost: ["eu"] })).kept)).toEqual(["b0@us"]);
  });

  it("keeps every site when none can take the request: flow control admitted it, spill-over decides", () => {
    const full = [cand("a0@eu", "eu", 1), cand("b0@us", "us", 1)];
    expect(ids(sitePreference(full, ctx(["eu", "us"])).kept)).toEqual(["a0@eu", "b0@us"]);
  });

  it("ranks sites the order does not name after those it does, equal among themselves", () => {
    const three = [...fleet, cand("c0@ap", "ap")];
    expect(ids(sitePreference(three, ctx([])).kept)).toEqual(ids(three));
    expect(ids(sitePreference(three, ctx(["ap"])).kept)).toEqual(["c0@ap"]);
    const apFull = [...fleet, cand("c0@ap", "ap", 1)];
    expect(ids(sitePreference(apFull, ctx(["ap"])).kept)).toEqual(ids(fleet));
  });

  it("sends a warming site only its share of its preferred traffic, the rest to the next site", () => {
    const c = ctx(["eu", "us"], { share: { eu: 0.25 } });
    let eu = 0;
    for (let i = 0; i < 2_000; i++) if (sitePreference(fleet, c).kept[0]!.spec.site === "eu") eu++;
    expect(eu / 2_000).toBeGreaterThan(0.2);
    expect(eu / 2_000).toBeLessThan(0.3);
    const aside = sitePreference(fleet, ctx(["eu", "us"], { share: { eu: 0 } })).rejected;
    expect(aside[0]!.reason).toBe("site eu came back and is warming up (0 % of its traffic)");
  });

  it("keeps a session on its warming site, and lets a warming site take what no other site can", () => {
    expect(ids(sitePreference(fleet, ctx(["eu", "us"], { share: { eu: 0 }, session: "eu" })).kept)).toEqual([
      "a0@eu",
      "a1@eu",
    ]);
    const usFull = [cand("a0@eu", "eu"), cand("b0@us", "us", 1)];
    expect(ids(sitePreference(usFull, ctx(["eu", "us"], { share: { eu: 0 } })).kept)).toEqual(["a0@eu"]);
  });

  it("is a no-op with one site", () => {
    const one = [cand("a0", "default"), cand("a1", "default")];
    expect(sitePreference(one, ctx(["eu"]))).toEqual({ kept: one, rejected: [] });
  });
});

describe("alternates across sites", () => {
  it("takes them in turn from each site, the chosen one's first, then by preference", () => {
    const ranked = [cand("a1@eu", "eu"), cand("a2@eu", "eu"), cand("c0@ap", "ap"), cand("b0@us", "us")];
    expect(ids(interleaveBySite(ranked, "eu", ["eu", "us", "ap"]))).toEqual([
      "a1@eu",
      "b0@us",
      "c0@ap",
      "a2@eu",
    ]);
  });
});
