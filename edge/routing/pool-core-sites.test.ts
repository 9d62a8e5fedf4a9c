import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../config/router.ts";
import { plainEndpoint } from "./plain-endpoint.ts";
import { type Admission, PoolCore } from "./pool-core.ts";
import type { EndpointSpec } from "./types.ts";

function ep(id: string, site: string | undefined): EndpointSpec {
  return plainEndpoint(id, { site });
}

/** The pool counts each site's admissions: `ctl status` and the dashboard print them as its share. */
describe("PoolCore's requests routed per site", () => {
  it("counts each admission under the site of the endpoint it went to, and nothing for a refusal", () => {
    const p = new PoolCore("m", routerSchema.parse({}), mulberry32(1));
    p.setEndpoints(1, [ep("a0@a", "a"), ep("b0@b", "b"), ep("d0", undefined)], 0);
    const chosen: string[] = [];
    for (let i = 0; i < 30; i++) {
      p.admit({ id: `r${i}`, band: "gold", key: "k", policy: "chat", prefix: [] }, 0, (a: Admission) => {
        if (a.ok) chosen.push(a.lease.endpoint.site ?? "default");
      });
    }
    const expected: Record<string, number> = {};
    for (const s of chosen) expected[s] = (expected[s] ?? 0) + 1;
    expect(chosen).toHaveLength(30);
    expect(p.status(0).routedBySite).toEqual(expected);
    expect(p.status(0).routedLastMinuteBySite).toEqual(expected);
    // A minute later the lifetime counts stay and the last minute's are gone.
    expect(p.status(60_000).routedBySite).toEqual(expected);
    expect(p.status(60_000).routedLastMinuteBySite).toEqual({});
    // Least-loaded picks spread 30 requests over all three sites' endpoints.
    expect(Object.keys(expected).sort()).toEqual(["a", "b", "default"]);

    p.setEndpoints(2, [], 0);
    p.admit({ id: "refused", band: "gold", key: "k", policy: "chat", prefix: [] }, 0, () => {});
    expect(p.status(0).routedBySite).toEqual(expected);
  });
});

describe("PoolCore across sites", () => {
  const fresh = (at: number) => ({
    waiting: 0,
    running: 0,
    kvUsage: 0,
    prefixCacheHitRate: 0,
    at,
    state: "ready" as const,
  });
  const twoSites = (sites: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) => {
    const p = new PoolCore(
      "m",
      routerSchema.parse({
        stale_after: "10s",
        sites: { continents: { EU: ["eu", "us"], NA: ["us", "eu"] }, warmup: "30s", ...sites },
        ...extra,
      }),
      mulberry32(3),
    );
    p.setEndpoints(1, [ep("e0@eu", "eu"), ep("e1@eu", "eu"), ep("u0@us", "us"), ep("u1@us", "us")], 0);
    return p;
  };
  const push = (p: PoolCore, ids: readonly string[], at: number) =>
    p.updateLoad(
      ids.map((endpoint) => ({ endpoint, sample: fresh(at) })),
      at,
    );
  let n = 0;
  const send = (p: PoolCore, now: number, extra: Record<string, unknown> = {}) => {
    let got: Admission | undefined;
    p.admit({ id: `q${++n}`, band: "gold", key: "k", policy: "chat", prefix: [], ...extra }, now, (a) => {
      got = a;
    });
    return got;
  };
  const siteOfLease = (a: Admission | undefined) =>
    a?.ok ? a.lease.endpoint.site : `refused: ${JSON.stringify(a)}`;

  it("sends a request to the site its location prefers, and records why the other was set aside", () => {
    const p = twoSites();
    for (let i = 0; i < 10; i++)
      expect(siteOfLease(send(p, 0, { location: { continent: "EU" } }))).toBe("eu");
    for (let i = 0; i < 10; i++)
      expect(siteOfLease(send(p, 0, { location: { continent: "NA" } }))).toBe("us");
    expect(p.status(0).lastRejections.map((r) => r.stage)).toEqual(["site", "site"]);
    expect(p.status(0).lastRejections[0]!.reason).toBe(
      "site eu waits while site us, preferred for continent NA, can take requests",
    );
    // No location, no default order: both sites, by load.
    const sites = new Set<string | undefined>();
    for (let i = 0; i < 10; i++) sites.add(siteOfLease(send(p, 0)));
    expect([...sites].sort()).toEqual(["eu", "us"]);
  });

  it("moves a session off a site whose load went stale, and alternates name the other site", () => {
    const p = twoSites();
    push(p, ["e0@eu", "e1@eu", "u0@us", "u1@us"], 0);
    const first = send(p, 1_000, { location: { continent: "EU" }, session: "s1" });
    expect(siteOfLease(first)).toBe("eu");
    if (first?.ok) expect(first.lease.alternates.map((e) => e.site)).toEqual(["eu", "us"]);
    push(p, ["u0@us", "u1@us"], 25_000); // eu silent for 25 s: stale past twice stale_after
    expect(siteOfLease(send(p, 25_000, { location: { continent: "EU" }, session: "s1" }))).toBe("us");
  });

  it("leaves a stale site out of the mean the bands are read against: bronze still goes on the live site", () => {
    const p = twoSites({}, { scoring: { target_inflight: 10 } });
    push(p, ["e0@eu", "e1@eu", "u0@us", "u1@us"], 0);
    push(p, ["u0@us", "u1@us"], 25_000);
    const st = p.status(25_000);
    expect(st.endpoints.filter((e) => e.site === "eu").map((e) => e.saturation)).toEqual([1, 1]);
    expect(st.saturation).toBe(0);
    expect(siteOfLease(send(p, 25_000, { band: "bronze" }))).toBe("us");
  });

  it("gives a returning site its preferred traffic back over the warm-up, not at once", () => {
    const p = twoSites();
    push(p, ["e0@eu", "e1@eu", "u0@us", "u1@us"], 0);
    for (let t = 2_000; t <= 30_000; t += 2_000) push(p, ["u0@us", "u1@us"], t);
    expect(siteOfLease(send(p, 30_000, { location: { continent: "EU" } }))).toBe("us");
    const share = (at: number) => {
      push(p, ["e0@eu", "e1@eu", "u0@us", "u1@us"], at);
      let eu = 0;
      for (let i = 0; i < 400; i++) {
        const a = send(p, at, { location: { continent: "EU" } });
        if (a?.ok) {
          if (a.lease.endpoint.site === "eu") eu++;
          p.release(a.lease.id, { attempts: [{ endpoint: a.lease.endpoint.id, verdict: "ok" }] }, at);
        }
      }
      return eu / 400;
    };
    expect(share(32_000)).toBe(0); // back at 32 s: nothing yet
    const mid = share(47_000);
    expect(mid).toBeGreaterThan(0.4);
    expect(mid).toBeLessThan(0.6);
    expect(share(62_000)).toBe(1);
  });
});
