import type { Timeline } from "./timeline.ts";

/** What the alarm needs of a simulated pool (PoolCore) to keep its time. */
export interface Wakeable {
  nextWakeAt(): number | undefined;
  tick(now: number): void;
}

/**
 * A pool's one timer on a simulated clock, as ModelPool keeps one with
 * setTimeout: after any call to the pool, a tick at its next wake-up (a
 * queue's TTL, a re-check, a lease's expiry), unless one is already due
 * sooner. A tick replaced by an earlier one does nothing when it comes.
 */
export class PoolAlarm {
  private due = Number.POSITIVE_INFINITY;

  constructor(
    private readonly tl: Timeline,
    private readonly pool: Wakeable,
  ) {}

  /** Called after every call into the pool. */
  arm(): void {
    const at = this.pool.nextWakeAt();
    if (at === undefined || at >= this.due) return;
    this.due = at;
    this.tl.at(at, () => {
      if (this.due !== at) return;
      this.due = Number.POSITIVE_INFINITY;
      this.pool.tick(this.tl.now);
      this.arm();
    });
  }
}
