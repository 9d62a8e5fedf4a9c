import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { PhaseTimeout, tighter, Watchdog, withTimeout } from "./timeouts.ts";

describe("timeouts", () => {
  it("rejects with the phase and calls the abort hook", async () => {
    let aborted = false;
    const never = new Promise<never>(() => {});
    const err = await withTimeout(never, 5, "first_token", () => {
      aborted = true;
    }).catch((e) => e);
    expect(err).toBeInstanceOf(PhaseTimeout);
    expect(err.phase).toBe("first_token");
    expect(aborted).toBe(true);
    expect(tighter("idle", 1000, 500, 0)).toEqual([500, "total"]);
    expect(tighter("idle", 100, 500, 0)).toEqual([100, "idle"]);
  });
});

describe("Watchdog", () => {
  // On fake timers (Date.now included), so each limit is checked to the millisecond.
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("fires for the phase whose limit passes without activity, once", () => {
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 10_000, (t) => fired.push(t.phase));
    w.arm("first_token", 30);
    vi.advanceTimersByTime(15);
    w.arm("idle", 40);
    for (let i = 0; i < 4; i++) {
      vi.advanceTimersByTime(15);
      w.touch();
    }
    // Last activity at 75 ms: idle runs out at 115 ms, not before.
    vi.advanceTimersByTime(39);
    expect(fired).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(fired).toEqual(["idle"]);
    vi.advanceTimersByTime(1_000);
    expect(fired).toEqual(["idle"]);
    w.stop();
  });

  it("keeps one timer for phases armed to later deadlines, and still fires on time", () => {
    const spy = vi.spyOn(globalThis, "setTimeout");
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 10_000, (t) => fired.push(t.phase), Date.now, 30);
    w.arm("response_header", 200);
    w.arm("first_token", 300);
    w.arm("idle", 40);
    expect(spy.mock.calls.length).toBe(1);
    spy.mockRestore();
    vi.advanceTimersByTime(39);
    expect(fired).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(fired).toEqual(["idle"]);
    w.stop();
  });

  it("moves the check forward when a phase ends sooner than the pending check", () => {
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 10_000, (t) => fired.push(t.phase));
    w.arm("first_token", 5_000);
    w.arm("idle", 30);
    vi.advanceTimersByTime(29);
    expect(fired).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(fired).toEqual(["idle"]);
    w.stop();
  });

  it("fires total when the overall deadline comes first", () => {
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 20, (t) => fired.push(t.phase));
    w.arm("idle", 1000);
    vi.advanceTimersByTime(19);
    expect(fired).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(fired).toEqual(["total"]);
  });
});
