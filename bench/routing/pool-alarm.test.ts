import { describe, expect, it } from "vitest";
import { PoolAlarm } from "./pool-alarm.ts";
import { Timeline } from "./timeline.ts";

/** A pool whose next wake-up the test sets, recording when it was ticked. */
function fakePool() {
  const pool = {
    wakes: [] as number[],
    ticks: [] as number[],
    nextWakeAt: (): number | undefined => pool.wakes[0],
    tick(now: number) {
      pool.ticks.push(now);
      pool.wakes = pool.wakes.filter((w) => w > now);
    },
  };
  return pool;
}

function runAll(tl: Timeline): void {
  while (tl.step()) {
    // Everything due, in order.
  }
}

describe("PoolAlarm", () => {
  it("ticks the pool at each wake-up it asks for, re-arming after each tick", () => {
    const tl = new Timeline();
    const pool = fakePool();
    pool.wakes = [100, 250];
    new PoolAlarm(tl, pool).arm();
    runAll(tl);
    expect(pool.ticks).toEqual([100, 250]);
  });

  // Two calls into the pool: the wake-ups it asks for after the first, then after the second.
  it.each([
    {
      when: "a call brings the wake-up forward: the tick moves earlier, the later one does nothing",
      first: [500],
      second: [200, 500],
      ticks: [200, 500],
    },
    {
      when: "a call asks for a later one: the sooner tick stays",
      first: [200],
      second: [200, 900],
      ticks: [200, 900],
    },
  ])("$when", ({ first, second, ticks }) => {
    const tl = new Timeline();
    const pool = fakePool();
    const alarm = new PoolAlarm(tl, pool);
    pool.wakes = first;
    alarm.arm();
    pool.wakes = second;
    alarm.arm();
    runAll(tl);
    expect(pool.ticks).toEqual(ticks);
  });
});
