import { describe, expect, it } from "vitest";
import type { EndpointRecord, EndpointsDoc } from "./catalog.ts";
import {
  idCollisions,
  mergeSite,
  qualifiedId,
  SiteParts,
  siteFeeds,
  siteNameSchema,
  unionOf,
} from "./site-sets.ts";

const rec = (id: string, models = ["m"]): EndpointRecord => ({
  id,
  url: `http://10.0.0.1:${8000 + id.length}`,
  models,
  pool: "default",
  weight: 1,
  priority: 0,
  via: "direct",
});
const doc = (version: number, ...ids: string[]): EndpointsDoc => ({
  version,
  endpoints: ids.map((id) => rec(id)),
});

describe("site names and ids", () => {
  it.each([
    ["default", true],
    ["eu-west", true],
    ["us1", true],
    ["EU", false],
    ["-eu", false],
    ["eu_west", false],
    ["", false],
    ["a".repeat(33), false],
  ])("%j is a site name: %s", (name, ok) => {
    expect(siteNameSchema.safeParse(name).success).toBe(ok);
  });

  it("qualifies every site's ids but the default site's", () => {
    expect(qualifiedId("default", "m/1gpu/0")).toBe("m/1gpu/0");
    expect(qualifiedId("eu", "m/1gpu/0")).toBe("m/1gpu/0@eu");
  });
});

describe("unionOf", () => {
  it("holds every site's endpoints under qualified ids, sites in name order, versions summed", () => {
    const u = unionOf(
      new Map([
        ["us", doc(7, "m/1gpu/0")],
        ["default", doc(2, "m/1gpu/0")],
        ["eu", doc(3, "m/1gpu/0", "m/1gpu/1")],
      ]),
    );
    expect(u.version).toBe(12);
    expect(u.endpoints.map((e) => [e.id, e.site])).toEqual([
      ["m/1gpu/0", "default"],
      ["m/1gpu/0@eu", "eu"],
      ["m/1gpu/1@eu", "eu"],
      ["m/1gpu/0@us", "us"],
    ]);
  });

  it("of nothing is version 0 and empty", () => {
    expect(unionOf(new Map())).toEqual({ version: 0, endpoints: [] });
  });
});

describe("mergeSite: a site's older set never replaces its newer one", () => {
  // Each row: the versions held per site, the set that arrives, whether it is taken, what is held after.
  it.each([
    { held: {}, arrives: ["eu", 1], taken: true, after: { eu: 1 } },
    { held: { eu: 3 }, arrives: ["eu", 4], taken: true, after: { eu: 4 } },
    { held: { eu: 3 }, arrives: ["eu", 3], taken: false, after: { eu: 3 } },
    { held: { eu: 3 }, arrives: ["eu", 2], taken: false, after: { eu: 3 } },
    // A slow site's old version does not touch a fast site's newer one.
    { held: { eu: 9, us: 2 }, arrives: ["us", 3], taken: true, after: { eu: 9, us: 3 } },
    { held: { eu: 9, us: 2 }, arrives: ["eu", 5], taken: false, after: { eu: 9, us: 2 } },
  ] as const)("$held + $arrives → taken $taken", ({ held, arrives, taken, after }) => {
    const m = new Map(Object.entries(held).map(([s, v]) => [s, doc(v, `e${v}`)]));
    expect(mergeSite(m, arrives[0], doc(arrives[1], `e${arrives[1]}`))).toBe(taken);
    expect(Object.fromEntries([...m].map(([s, d]) => [s, d.version]))).toEqual(after);
  });
});

describe("SiteParts: one model's pool", () => {
  it("routes over the union, its version grows with every part taken, and a stale part changes nothing", () => {
    const p = new SiteParts<string>();
    expect(p.set("eu", 2, ["a@eu"])).toBe(true);
    expect(p.set("default", 5, ["a", "b"])).toBe(true);
    expect(p.union()).toEqual(["a", "b", "a@eu"]);
    expect(p.version).toBe(7);
    // A late push or a KV copy not caught up: eu's version 1 after its version 2.
    expect(p.set("eu", 1, [])).toBe(false);
    expect(p.union()).toEqual(["a", "b", "a@eu"]);
    expect(p.set("eu", 3, [])).toBe(true);
    expect(p.union()).toEqual(["a", "b"]);
    expect(p.version).toBe(8);
    expect(p.sites()).toEqual([
      { site: "default", version: 5, endpoints: 2 },
      { site: "eu", version: 3, endpoints: 0 },
    ]);
  });
});

describe("idCollisions", () => {
  it("refuses an id another site's endpoint already has in the union, and only that", () => {
    const sets = new Map([["eu", doc(1, "x")]]);
    // The default site's ids are not qualified: "x@eu" would be eu's "x".
    expect(idCollisions(sets, "default", [rec("y"), rec("x@eu")])).toEqual([
      { index: 1, message: '"x@eu" is already an endpoint of site "eu"' },
    ]);
    expect(idCollisions(sets, "us", [rec("x")])).toEqual([]);
    // A site's own old set is the one being replaced, never a clash.
    expect(idCollisions(sets, "eu", [rec("x")])).toEqual([]);
  });
});

describe("siteFeeds", () => {
  it.each([
    { ages: [100, null], feed: "live" },
    { ages: [20_000, 100], feed: "live" },
    { ages: [20_000, 30_000], feed: "stale" },
    { ages: [20_000, null], feed: "stale" },
    { ages: [null, null], feed: "none" },
  ] as const)("a site whose endpoints' loads are $ages ms old is $feed", ({ ages, feed }) => {
    const eps = ages.map((loadAgeMs) => ({ site: "eu", loadAgeMs }));
    expect(siteFeeds([...eps, { site: "us", loadAgeMs: 1 }], 10_000)).toEqual(
      new Map([
        ["eu", feed],
        ["us", "live"],
      ]),
    );
  });
});
