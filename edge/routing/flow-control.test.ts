import { describe, expect, it } from "vitest";
import { type BandSpec, FlowController, type Waiter } from "./flow-control.ts";

const BANDS: BandSpec[] = [
  { name: "platinum", priority: 400, ceiling: 1.0 },
  { name: "gold", priority: 300, ceiling: 0.85 },
  { name: "silver", priority: 200, ceiling: 0.6 },
  { name: "bronze", priority: 100, ceiling: 0.3 },
];

function fc(opts: Partial<{ enabled: boolean; capacityPerBand: number; ttlMs: number }> = {}) {
  return new FlowController<string>(BANDS, { enabled: true, capacityPerBand: 100, ttlMs: 30_000, ...opts });
}

let seq = 0;
function w(band: string, key = "k", now = 0, ttl = 30_000): Waiter<string> {
  const id = `r${++seq}`;
  return { id, band, key, enqueuedAt: now, deadline: now + ttl, item: id };
}

describe("FlowController", () => {
  it.each([
    ["platinum", 0.99, "dispatch"],
    ["platinum", 1.0, "queued"],
    ["gold", 0.84, "dispatch"],
    ["gold", 0.85, "queued"],
    ["silver", 0.59, "dispatch"],
    ["silver", 0.6, "queued"],
    ["bronze", 0.29, "dispatch"],
    ["bronze", 0.3, "queued"],
  ] as const)("%s at saturation %d: %s", (band, sat, expected) => {
    expect(fc().offer(w(band), sat)).toBe(expected);
  });

  it("a queued band goes once saturation falls under its ceiling, highest band first", () => {
    const f = fc();
    const b = w("bronze");
    const g = w("gold");
    expect(f.offer(b, 0.9)).toBe("queued");
    expect(f.offer(g, 0.9)).toBe("queued");
    expect(f.next(0.9)).toBeUndefined();
    expect(f.next(0.5)?.id).toBe(g.id);
    // Gold is gone; bronze still needs saturation under 0.3.
    expect(f.next(0.5)).toBeUndefined();
    expect(f.next(0.2)?.id).toBe(b.id);
    expect(f.size).toBe(0);
  });

  it("head-of-line blocking: a waiting higher band over its ceiling holds every lower band", () => {
    const f = fc();
    expect(f.offer(w("gold"), 0.9)).toBe("queued");
    // Saturation 0.1 would let bronze through on its own, and drops below
    // gold's ceiling only for the next call.
    expect(f.offer(w("bronze"), 0.86)).toBe("queued");
    expect(f.offer(w("silver"), 0.86)).toBe("queued");
    expect(f.next(0.86)).toBeUndefined();
    // A higher band than the one waiting is not blocked by it.
    expect(f.offer(w("platinum"), 0.86)).toBe("dispatch");
    expect(f.next(0.5)?.band).toBe("gold");
    expect(f.next(0.5)?.band).toBe("silver");
  });

  it("FIFO within a band: a new request waits behind its band's queue even under the ceiling", () => {
    const f = fc();
    const first = w("gold");
    expect(f.offer(first, 0.9)).toBe("queued");
    expect(f.offer(w("gold"), 0.1)).toBe("queued");
    expect(f.next(0.1)?.id).toBe(first.id);
  });

  it("a full band refuses, other bands still queue", () => {
    const f = fc({ capacityPerBand: 2 });
    expect(f.offer(w("silver"), 1)).toBe("queued");
    expect(f.offer(w("silver"), 1)).toBe("queued");
    expect(f.offer(w("silver"), 1)).toBe("full");
    expect(f.offer(w("bronze"), 1)).toBe("queued");
    expect(f.depth("silver")).toBe(2);
  });

  it("TTL: waiters past their deadline expire, the rest stay in order", () => {
    const f = fc();
    const a = w("gold", "k", 0, 1_000);
    const b = w("gold", "k", 500, 1_000);
    f.offer(a, 1);
    f.offer(b, 1);
    expect(f.nextDeadline()).toBe(1_000);
    expect(f.expire(999)).toEqual([]);
    expect(f.expire(1_000).map((x) => x.id)).toEqual([a.id]);
    expect(f.nextDeadline()).toBe(1_500);
    expect(f.next(0)?.id).toBe(b.id);
  });

  it("fair across keys: one key's burst does not push another key's request to the back", () => {
    const f = fc();
    for (let i = 0; i < 10; i++) f.offer(w("gold", "noisy"), 1);
    f.offer(w("gold", "quiet"), 1);
    f.offer(w("gold", "quiet"), 1);
    const order = Array.from({ length: 6 }, () => f.next(0)!.key);
    expect(order).toEqual(["noisy", "quiet", "noisy", "quiet", "noisy", "noisy"]);
  });

  it("a waiter whose client left is removed without dispatch", () => {
    const f = fc();
    const a = w("gold");
    const b = w("gold");
    f.offer(a, 1);
    f.offer(b, 1);
    expect(f.remove(a.id)?.id).toBe(a.id);
    expect(f.remove(a.id)).toBeUndefined();
    expect(f.next(0)?.id).toBe(b.id);
    expect(f.size).toBe(0);
  });

  it("disabled: everything dispatches at once", () => {
    const f = fc({ enabled: false });
    expect(f.offer(w("bronze"), 5)).toBe("dispatch");
    expect(f.size).toBe(0);
  });

  it("reconfigured: waiters of a removed band come back for refusal, the others keep their place", () => {
    const f = fc();
    const g = w("gold");
    const b = w("bronze");
    f.offer(g, 1);
    f.offer(b, 1);
    const orphans = f.configure(
      BANDS.filter((x) => x.name !== "bronze"),
      { enabled: true, capacityPerBand: 100, ttlMs: 30_000 },
    );
    expect(orphans.map((x) => x.id)).toEqual([b.id]);
    expect(f.next(0)?.id).toBe(g.id);
  });
});
