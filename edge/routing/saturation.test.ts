import { describe, expect, it } from "vitest";
import { routerSchema } from "../router-config.ts";
import { decayTowardOne, feedIsLive, poolSaturation, saturationOf, signals } from "./saturation.ts";
import type { LoadSample } from "./types.ts";

const scoring = routerSchema.parse({
  scoring: { target_waiting: 4, target_inflight: 10, kv_ceiling: 0.8 },
}).scoring;
const load = (at: number, waiting: number, kvUsage: number): LoadSample => ({
  waiting,
  running: 0,
  kvUsage,
  prefixCacheHitRate: 0,
  at,
  state: "ready",
});

describe("saturation", () => {
  it("is the largest signal over its target, in-flight per unit of weight", () => {
    const g = signals({ inflight: 5, weight: 2, load: load(0, 2, 0.4) }, scoring, 10_000, 0, true);
    expect(g).toEqual({ waiting: 0.5, kv: 0.5, inflight: 0.25 });
    expect(saturationOf(g)).toBe(0.5);
  });

  it("decays a stale signal linearly toward 1.0 over another stale_after, from above as from below", () => {
    expect(decayTowardOne(0.2, 10_000, 10_000)).toBe(0.2);
    expect(decayTowardOne(0.2, 15_000, 10_000)).toBeCloseTo(0.6);
    expect(decayTowardOne(0.2, 20_000, 10_000)).toBe(1);
    expect(decayTowardOne(3, 15_000, 10_000)).toBe(2);
    expect(decayTowardOne(3, 60_000, 10_000)).toBe(1);
  });

  it("leaves scraped terms out when the feed is down or the endpoint was never scraped", () => {
    const e = { inflight: 2, weight: 1, load: load(0, 8, 0.8) };
    expect(signals(e, scoring, 10_000, 100_000, false)).toEqual({ waiting: 0, kv: 0, inflight: 0.2 });
    expect(signals({ ...e, load: undefined }, scoring, 10_000, 0, true)).toEqual({
      waiting: 0,
      kv: 0,
      inflight: 0.2,
    });
    expect(feedIsLive([load(0, 0, 0), undefined], 10_000, 10_000)).toBe(true);
    expect(feedIsLive([load(0, 0, 0), undefined], 10_000, 10_001)).toBe(false);
    expect(feedIsLive([undefined], 10_000, 0)).toBe(false);
  });

  it("a pool is the mean of its routable endpoints; none is infinitely saturated", () => {
    expect(poolSaturation([0.2, 0.4, 0.9])).toBeCloseTo(0.5);
    expect(poolSaturation([])).toBe(Number.POSITIVE_INFINITY);
  });
});
