import { describe, expect, it } from "vitest";
import { type RegistrationInfo, Registry } from "./registry.ts";

const timers = {
  unreachableAfterMs: 15_000,
  lostAfterMs: 60_000,
  startupGraceMs: 60_000,
  lostFreezeFraction: 0.5,
};

function info(name: string): RegistrationInfo {
  return {
    name,
    agentVersion: "test",
    agentInstance: `${name}-1`,
    advertiseAddress: "127.0.0.1",
    fabric: { ib: "a" },
    inventory: { gpus: [], cpuCores: 8, ramTotalMiB: 1024, hostname: name, simulated: true },
  };
}

describe("Registry", () => {
  it("moves a silent node ready → unreachable → lost at the configured times", () => {
    const r = new Registry({ ...timers, startupGraceMs: 0 }, 0);
    r.register(info("a"), 0);
    r.register(info("b"), 0);
    r.register(info("c"), 0);
    for (let t = 1_000; t <= 100_000; t += 1_000) {
      r.seen("b", t);
      r.seen("c", t);
      const moved = r.tick(t);
      if (t === 15_000) expect(moved.map((m) => [m.node, m.to])).toEqual([["a", "unreachable"]]);
      else if (t === 60_000) expect(moved.map((m) => [m.node, m.to])).toEqual([["a", "lost"]]);
      else expect(moved).toEqual([]);
    }
    expect(r.get("a")?.state).toBe("lost");
    const back = r.register(info("a"), 101_000);
    expect(back).toMatchObject({ from: "lost", to: "ready" });
  });

  it("holds lost back during the startup grace period", () => {
    const r = new Registry(timers, 0);
    r.register(info("a"), 0);
    r.register(info("b"), 0);
    r.register(info("c"), 0);
    let lostAt = -1;
    for (let t = 1_000; t <= 200_000; t += 1_000) {
      r.seen("b", t);
      r.seen("c", t);
      if (r.tick(t).some((m) => m.to === "lost")) lostAt = t;
    }
    // lost_after alone would allow 60 s; the grace ends at 60 s too, so the
    // first tick after both have passed declares it.
    expect(lostAt).toBe(60_000);
    const late = new Registry({ ...timers, startupGraceMs: 120_000 }, 0);
    late.register(info("a"), 0);
    late.register(info("b"), 0);
    late.register(info("c"), 0);
    lostAt = -1;
    for (let t = 1_000; t <= 200_000; t += 1_000) {
      late.seen("b", t);
      late.seen("c", t);
      if (late.tick(t).some((m) => m.to === "lost")) lostAt = t;
    }
    expect(lostAt).toBe(120_000);
  });

  it("freezes lost while more than half the fleet is unreachable", () => {
    const r = new Registry({ ...timers, startupGraceMs: 0 }, 0);
    for (const n of ["a", "b", "c"]) r.register(info(n), 0);
    // a and b go silent together: 2/3 unreachable.
    for (let t = 1_000; t <= 120_000; t += 1_000) {
      r.seen("c", t);
      r.tick(t);
    }
    expect(r.lostFrozen).toBe(true);
    expect(r.counts()).toEqual({ ready: 1, unreachable: 2, lost: 0 });
    // b comes back: 1/3 unreachable, the freeze lifts and a is lost.
    r.seen("b", 121_000);
    r.seen("c", 121_000);
    const moved = r.tick(121_000);
    expect(r.lostFrozen).toBe(false);
    expect(moved).toEqual([expect.objectContaining({ node: "a", to: "lost" })]);
  });

  it("keeps the ready-since time across a re-registration of a ready node", () => {
    const r = new Registry(timers, 0);
    r.register(info("a"), 0);
    expect(r.register(info("a"), 5_000)).toBeUndefined();
    expect(r.get("a")?.stateSince).toBe(0);
  });

  it("makes a revoked node lost at once, grace and freeze notwithstanding", () => {
    const r = new Registry(timers, 0);
    r.register(info("a"), 0);
    r.register(info("b"), 0);
    expect(r.revoke("a", 1_000)).toMatchObject({
      node: "a",
      from: "ready",
      to: "lost",
      reason: "certificate revoked",
    });
    expect(r.get("a")).toMatchObject({ state: "lost", connected: false });
    expect(r.revoke("a", 2_000)).toBeUndefined();
    expect(r.revoke("nobody", 2_000)).toBeUndefined();
    expect(r.tick(3_000)).toEqual([]);
  });
});
