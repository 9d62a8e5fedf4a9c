import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../config/router.ts";
import { plainEndpoint } from "./plain-endpoint.ts";
import {
  type Admission,
  type AdmitRequest,
  GRANT_HOLD_MS,
  GRANTS_PER_CHANNEL,
  PoolCore,
} from "./pool-core.ts";

function pool(n: number, maxSeqs: number, router: Record<string, unknown> = {}, seed = 1) {
  const p = new PoolCore("m", routerSchema.parse(router), mulberry32(seed));
  p.setEndpoints(
    1,
    Array.from({ length: n }, (_, i) => plainEndpoint(`e${i}`, { capacity: { maxSeqs } })),
    0,
  );
  return p;
}

let seq = 0;
const req = (extra: Partial<AdmitRequest> = {}): AdmitRequest => ({
  id: `r${++seq}`,
  band: "gold",
  key: "k",
  policy: "chat",
  prefix: [],
  ...extra,
});

function admitted(p: PoolCore, r: AdmitRequest, now = 0) {
  let a: Admission | undefined;
  p.admit(r, now, (x) => {
    a = x;
  });
  if (!a?.ok) throw new Error(`expected a lease, got ${JSON.stringify(a)}`);
  return a.lease;
}

/** Each endpoint's requests in flight and grants' slots set aside. */
const held = (p: PoolCore, now = 0) => p.status(now).endpoints.map((e) => [e.inflight, e.reserved]);

describe("PoolCore grants", () => {
  it("sets a slot aside where a like request would go, counted in flight until its use becomes a lease and its release frees it", () => {
    const p = pool(2, 256);
    const first = req();
    const lease = admitted(p, first);
    const g = p.offerGrant("iso", first, 0);
    if (!g) throw new Error("no grant");
    // The load tier spreads: the slot is on the other endpoint, set aside there now.
    expect(g.endpoint.id).not.toBe(lease.endpoint.id);
    expect(held(p)).toEqual([
      [1, 0],
      [0, 1],
    ]);
    expect(p.status(0).grants).toMatchObject({ issued: 1, outstanding: 1 });
    const next = req({ band: "bronze", prefix: [1, 2, 3, 4] });
    p.useGrant({ grant: g.id, endpoint: g.endpoint.id, req: next }, 10);
    expect(held(p, 10)).toEqual([
      [1, 0],
      [1, 0],
    ]);
    expect(p.status(10).grants).toMatchObject({ used: 1, outstanding: 0 });
    expect(p.status(10).bands.find((b) => b.name === "bronze")?.admitted).toBe(1);
    // Its prompt is recorded where the grant put it: the pool's next decision for it goes there.
    const again = admitted(p, req({ prefix: [1, 2, 3, 4] }), 20);
    expect([again.endpoint.id, again.route]).toEqual([g.endpoint.id, "prefix"]);
    p.release(g.id, { attempts: [{ endpoint: g.endpoint.id, verdict: "ok" }] }, 30);
    p.release(lease.id, { attempts: [{ endpoint: lease.endpoint.id, verdict: "ok" }] }, 30);
    p.release(again.id, { attempts: [{ endpoint: again.endpoint.id, verdict: "ok" }] }, 30);
    expect(held(p, 30)).toEqual([
      [0, 0],
      [0, 0],
    ]);
  });

  it("grants nothing that would bring the pool to a quarter of the lowest ceiling, nor while a band waits", () => {
    // 2 × 4 slots, bronze's ceiling 0.30: a quarter of it is 0.6 of the 8 slots.
    const p = pool(2, 4);
    const first = req();
    admitted(p, first);
    expect(p.offerGrant("iso", first, 0)).toBeUndefined();
    expect(held(p)).toEqual([
      [1, 0],
      [0, 0],
    ]);
    // A larger engine leaves room for slots while the pool, slot counted, stays under a quarter of bronze's 0.30.
    const roomy = pool(1, 64);
    const given: boolean[] = [];
    for (let i = 0; i < 40 && given.at(-1) !== false; i++) {
      const r = req();
      admitted(roomy, r);
      const g = roomy.offerGrant("iso", r, 0);
      given.push(g !== undefined);
      if (g) expect(roomy.status(0).saturation).toBeLessThan(0.075);
      if (g) roomy.returnGrant(g.id, 0);
    }
    expect(given[0]).toBe(true);
    expect(given.at(-1)).toBe(false);
    expect(roomy.status(0).saturation).toBeLessThan(0.075);
    expect(roomy.offerGrant("iso", req(), 0)).toBeUndefined();
    // Bronze, over its ceiling, waits: no grant for anyone while it does.
    const bronze = Array.from({ length: 20 }, () => req({ band: "bronze" }));
    let decided = 0;
    for (const b of bronze) roomy.admit(b, 0, () => decided++);
    expect(decided).toBeLessThan(20);
    expect(roomy.offerGrant("iso", req({ band: "platinum" }), 0)).toBeUndefined();
  });

  it("an unused slot is freed when given back, or when it expires after GRANT_HOLD_MS", () => {
    const p = pool(1, 256);
    const first = req();
    admitted(p, first);
    const back = p.offerGrant("iso", first, 0)!;
    const kept = p.offerGrant("iso", first, 0)!;
    expect(held(p)).toEqual([[1, 2]]);
    p.returnGrant(back.id, 5);
    expect(held(p, 5)).toEqual([[1, 1]]);
    expect(p.nextWakeAt()).toBeLessThanOrEqual(GRANT_HOLD_MS);
    p.tick(GRANT_HOLD_MS - 1);
    expect(held(p, GRANT_HOLD_MS - 1)).toEqual([[1, 1]]);
    p.tick(GRANT_HOLD_MS);
    expect(held(p, GRANT_HOLD_MS)).toEqual([[1, 0]]);
    expect(p.status(GRANT_HOLD_MS).grants).toMatchObject({ returned: 1, expired: 1, outstanding: 0 });
    // Told of its use after that, the pool charges the request anew where it runs.
    p.useGrant({ grant: kept.id, endpoint: "e0", req: req() }, GRANT_HOLD_MS + 1);
    expect(held(p, GRANT_HOLD_MS + 1)).toEqual([[2, 0]]);
    expect(p.status(GRANT_HOLD_MS + 1).grants).toMatchObject({ late: 1, used: 0 });
    p.release(kept.id, { attempts: [{ endpoint: "e0", verdict: "ok" }] }, GRANT_HOLD_MS + 2);
    expect(held(p, GRANT_HOLD_MS + 2)).toEqual([[1, 0]]);
  });

  it("at most GRANTS_PER_CHANNEL outstanding per channel, only for the chat policy and no session, and none with grants off", () => {
    const p = pool(4, 4_096);
    const basis = req();
    admitted(p, basis);
    const got = Array.from({ length: GRANTS_PER_CHANNEL + 3 }, () => p.offerGrant("iso", basis, 0));
    expect(got.filter(Boolean)).toHaveLength(GRANTS_PER_CHANNEL);
    expect(p.offerGrant("other", basis, 0)).toBeDefined();
    expect(p.offerGrant("other", req({ policy: "round-robin" }), 0)).toBeUndefined();
    expect(p.offerGrant("other", req({ session: "s" }), 0)).toBeUndefined();
    const off = pool(1, 4_096, { admission: { grants: false } });
    admitted(off, basis);
    expect(off.offerGrant("iso", basis, 0)).toBeUndefined();
  });

  it("grants from two pool instances never share an id", () => {
    const a = pool(1, 256);
    const b = pool(1, 256, {}, 2);
    const basis = req();
    expect(a.offerGrant("iso", basis, 0)?.id).not.toBe(b.offerGrant("iso", basis, 0)?.id);
  });

  it("a chain of grants, one request after another, takes the endpoints in turn as the pool's own decisions do", () => {
    const p = pool(2, 256);
    const ok = (endpoint: string) => ({ attempts: [{ endpoint, verdict: "ok" as const }] });
    let basis = req();
    const first = admitted(p, basis);
    let g = p.offerGrant("iso", basis, 0)!;
    p.release(first.id, ok(first.endpoint.id), 1);
    const seen = [first.endpoint.id];
    for (let t = 2; t < 8; t++) {
      // As one call carries them: the use, the request's release, then the next grant.
      basis = req();
      p.useGrant({ grant: g.id, endpoint: g.endpoint.id, req: basis }, t);
      seen.push(g.endpoint.id);
      p.release(g.id, ok(g.endpoint.id), t);
      g = p.offerGrant("iso", basis, t)!;
    }
    expect(seen).toEqual(["e0", "e1", "e0", "e1", "e0", "e1", "e0"]);
  });

  it("sets nothing aside on an endpoint whose breaker is not closed: its probe is the pool's own decision", () => {
    const p = pool(1, 256, { failure_threshold: 1, cooldown: "1s" });
    const first = req();
    const lease = admitted(p, first);
    p.release(lease.id, { attempts: [{ endpoint: "e0", verdict: "fail", reason: "reset" }] }, 0);
    expect(p.offerGrant("iso", first, 0)).toBeUndefined();
    // Half-open after the cooldown, no probe on its way yet: still none until a probe closes it.
    expect(p.offerGrant("iso", first, 1_000)).toBeUndefined();
    const probe = admitted(p, req(), 1_000);
    p.release(probe.id, { attempts: [{ endpoint: "e0", verdict: "ok" }] }, 1_001);
    expect(p.offerGrant("iso", first, 1_001)).toBeDefined();
  });
});
