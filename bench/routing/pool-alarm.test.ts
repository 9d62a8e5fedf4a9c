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

  it("moves the tick earlier when a call brings the wake-up forward, and the later one does nothing", () => {
    const tl = new Timeline();
    const pool = fakePool();
    const alarm = new PoolAlarm(tl, pool);
    pool.wakes = [500];
    alarm.arm();
    pool.wakes = [200, 500];
    alarm.arm();
    runAll(tl);
    expect(pool.ticks).toEqual([200, 500]);
  });

  it("keeps the sooner tick when a call asks for a later one", () => {
    const tl = new Timeline();
    const pool = fakePool();
    const alarm = new PoolAlarm(tl, pool);
    pool.wakes = [200];
    alarm.arm();
    pool.wakes = [200, 900];
    alarm.arm();
    runAll(tl);
    expect(pool.ticks).toEqual([200, 900]);
  });
});
