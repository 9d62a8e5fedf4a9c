import { describe, expect, it } from "vitest";
import { mulberry32 } from "../common/rng.ts";
import { ReconnectSchedule } from "./reconnect-schedule.ts";

/**
 * A fleet of agents that all lost the control plane at t=0, on a virtual
 * clock: each dials at its schedule's times, and the first attempt at or
 * after `backAt` succeeds. Returns each agent's delay after the return.
 */
function returnDelays(agents: number, spreadMs: number, backAt: number, seed = 1): number[] {
  const random = mulberry32(seed);
  return Array.from({ length: agents }, () => {
    const s = new ReconnectSchedule({ baseMs: 1_000, maxMs: 5_000, random });
    let t = s.next(spreadMs);
    while (t < backAt) t += s.next(spreadMs);
    return t - backAt;
  });
}

function largestSecond(delays: number[]): number {
  const buckets = new Map<number, number>();
  for (const d of delays) buckets.set(Math.floor(d / 1000), (buckets.get(Math.floor(d / 1000)) ?? 0) + 1);
  return Math.max(...buckets.values()) / delays.length;
}

describe("ReconnectSchedule", () => {
  it("ramps with full jitter from the base, then retries once per ceiling", () => {
    const s = new ReconnectSchedule({ baseMs: 1_000, maxMs: 5_000, random: () => 0.999 });
    expect([s.next(0), s.next(0), s.next(0)]).toEqual([999, 1_998, 3_996]);
    // At the ceiling: one draw for the phase, then the period itself.
    expect([s.next(0), s.next(0), s.next(0)]).toEqual([4_995, 5_000, 5_000]);
    s.reset();
    expect(s.next(0)).toBe(999);
  });

  it("uses the control plane's spread as the window when it is wider", () => {
    const draws = [0.5, 0.1];
    const s = new ReconnectSchedule({ baseMs: 1_000, maxMs: 5_000, random: () => draws.shift() ?? 0 });
    expect([s.next(15_000), s.next(15_000), s.next(15_000)]).toEqual([7_500, 15_000, 15_000]);
    // A new spread (the fleet grew) draws a new phase.
    expect(s.next(20_000)).toBe(2_000);
  });

  it("brings a small fleet back within the ceiling after any outage", () => {
    for (const outage of [10_000, 45_000, 300_000]) {
      const delays = returnDelays(2_000, 1_000, outage, outage);
      expect(Math.max(...delays)).toBeLessThanOrEqual(5_000);
    }
  });

  it("spreads 1,000 agents so that no second takes more than a tenth of them", () => {
    for (const outage of [0, 10_000, 45_000, 300_000]) {
      const delays = returnDelays(1_000, 15_000, outage, outage + 7);
      expect(largestSecond(delays)).toBeLessThanOrEqual(0.1);
      expect(Math.max(...delays)).toBeLessThanOrEqual(15_000);
    }
  });
});
