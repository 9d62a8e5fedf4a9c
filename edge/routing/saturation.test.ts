import { describe, expect, it } from "vitest";
import { routerSchema } from "../config/router.ts";
import {
  ASSUMED_MAX_NUM_SEQS,
  decayTowardOne,
  feedIsLive,
  inflightTarget,
  poolSaturation,
  saturationOf,
  signals,
} from "./saturation.ts";
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
    const e = {
      inflight: 5,
      tokens: 0,
      prefillLoad: 0,
      weight: 2,
      capacity: undefined,
      load: load(0, 2, 0.4),
    };
    const g = signals(e, scoring, 10_000, 0, true);
    expect(g).toEqual({ waiting: 0.5, kv: 0.5, inflight: 0.25, tokens: 0, prefilling: 0 });
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
    const e = {
      inflight: 2,
      tokens: 0,
      prefillLoad: 0,
      weight: 1,
      capacity: undefined,
      load: load(0, 8, 0.8),
    };
    expect(signals(e, scoring, 10_000, 100_000, false)).toEqual({
      waiting: 0,
      kv: 0,
      inflight: 0.2,
      tokens: 0,
      prefilling: 0,
    });
    expect(signals({ ...e, load: undefined }, scoring, 10_000, 0, true)).toEqual({
      waiting: 0,
      kv: 0,
      inflight: 0.2,
      tokens: 0,
      prefilling: 0,
    });
    expect(feedIsLive([load(0, 0, 0), undefined], 10_000, 10_000)).toBe(true);
    expect(feedIsLive([load(0, 0, 0), undefined], 10_000, 10_001)).toBe(false);
    expect(feedIsLive([undefined], 10_000, 0)).toBe(false);
  });

  it("a pool is the mean of its routable endpoints; none is infinitely saturated", () => {
    expect(poolSaturation([0.2, 0.4, 0.9])).toBeCloseTo(0.5);
    expect(poolSaturation([])).toBe(Number.POSITIVE_INFINITY);
  });

  describe("the pool's own charges against the engine's capacity", () => {
    const byCapacity = routerSchema.parse({ scoring: { seq_ceiling: 0.5, kv_ceiling: 0.8 } }).scoring;

    it("counts requests in flight against the share of the engine's batch, not a constant", () => {
      // The burst that inverted the bands: 30 in flight on a 4-slot engine.
      const e = {
        inflight: 30,
        tokens: 0,
        prefillLoad: 0,
        weight: 1,
        capacity: { maxSeqs: 4 },
        load: undefined,
      };
      expect(inflightTarget(e, byCapacity)).toBe(4);
      expect(signals(e, byCapacity, 10_000, 0, true).inflight).toBe(7.5);
    });

    it("takes seq_ceiling of a large batch, but never fewer than seq_floor or the whole batch below it", () => {
      const target = (maxSeqs: number, seq_floor = 16) =>
        inflightTarget({ weight: 1, capacity: { maxSeqs } }, { ...byCapacity, seq_floor });
      expect(target(256)).toBe(128);
      expect(target(48)).toBe(24);
      expect(target(24)).toBe(16);
      expect(target(8)).toBe(8);
      expect(target(8, 0)).toBe(4);
      expect(target(256, 200)).toBe(200);
    });

    it("assumes vLLM's default batch, by weight, where the capacity is unknown; target_inflight overrides both", () => {
      expect(inflightTarget({ weight: 2, capacity: undefined }, byCapacity)).toBe(ASSUMED_MAX_NUM_SEQS);
      expect(inflightTarget({ weight: 1, capacity: { kvTokens: 1000 } }, byCapacity)).toBe(128);
      const override = { ...byCapacity, target_inflight: 10 };
      expect(inflightTarget({ weight: 2, capacity: { maxSeqs: 4 } }, override)).toBe(20);
    });

    it("counts charged tokens against the KV cache's tokens under kv_ceiling, and only when that is known", () => {
      const e = {
        inflight: 1,
        tokens: 4000,
        prefillLoad: 0,
        weight: 1,
        capacity: { maxSeqs: 256, kvTokens: 10_000 },
        load: undefined,
      };
      expect(signals(e, byCapacity, 10_000, 0, true).tokens).toBe(0.5);
      expect(signals({ ...e, capacity: { maxSeqs: 256 } }, byCapacity, 10_000, 0, true).tokens).toBe(0);
    });

    it("counts streams not yet at their first token against target_prefilling, per unit of weight", () => {
      // A burst of long prompts on a batch-256 engine: few sequences, but a queue in front of the next prompt.
      const e = { inflight: 8, tokens: 0, prefillLoad: 6, weight: 2, capacity: { maxSeqs: 256 } };
      const g = signals({ ...e, load: undefined }, { ...byCapacity, target_prefilling: 4 }, 10_000, 0, true);
      expect(g.inflight).toBeCloseTo(0.0625);
      expect(g.prefilling).toBeCloseTo(0.75);
      expect(saturationOf(g)).toBe(g.prefilling);
    });

    it("scraped figures only ever raise it: the higher of charged and scraped wins", () => {
      const e = {
        inflight: 1,
        tokens: 0,
        prefillLoad: 0,
        weight: 1,
        capacity: { maxSeqs: 4 },
        load: load(0, 8, 0.1),
      };
      expect(saturationOf(signals(e, byCapacity, 10_000, 0, true))).toBe(2);
      const idle = { ...e, inflight: 4, load: load(0, 0, 0) };
      expect(saturationOf(signals(idle, byCapacity, 10_000, 0, true))).toBe(1);
    });
  });
});
