import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../config/router.ts";
import { type Admission, PoolCore } from "./pool-core.ts";
import type { EndpointSpec } from "./types.ts";

function ep(id: string, site: string | undefined): EndpointSpec {
  return { id, url: `http://${id}`, spillGroup: "default", priority: 0, weight: 1, via: "direct", site };
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
    // Least-loaded picks spread 30 requests over all three sites' endpoints.
    expect(Object.keys(expected).sort()).toEqual(["a", "b", "default"]);

    p.setEndpoints(2, [], 0);
    p.admit({ id: "refused", band: "gold", key: "k", policy: "chat", prefix: [] }, 0, () => {});
    expect(p.status(0).routedBySite).toEqual(expected);
  });
});
