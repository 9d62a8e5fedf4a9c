/**
 * Counts per key over the last minute, in 10-second buckets: a site's share
 * of what the pool routes *now*, which its lifetime count hides — after a
 * site's loss and return, the lifetime shares still read as before the loss
 * (docs/sites.md, "Operate it"). The window slides a bucket at a time, so a
 * reading covers between 50 and 60 seconds.
 */
const WINDOW_MS = 60_000;
const BUCKET_MS = 10_000;
const BUCKETS = WINDOW_MS / BUCKET_MS;

export class RecentCounts {
  /** Bucket start → counts by key; at most BUCKETS of them. */
  private readonly buckets = new Map<number, Map<string, number>>();

  add(key: string, now: number): void {
    const start = now - (now % BUCKET_MS);
    let b = this.buckets.get(start);
    if (!b) {
      b = new Map();
      this.buckets.set(start, b);
      this.forget(now);
    }
    b.set(key, (b.get(key) ?? 0) + 1);
  }

  /** Each key's count within the window ending at `now`. */
  snapshot(now: number): Record<string, number> {
    this.forget(now);
    const out: Record<string, number> = {};
    for (const b of this.buckets.values()) for (const [k, n] of b) out[k] = (out[k] ?? 0) + n;
    return out;
  }

  private forget(now: number): void {
    const oldest = now - (now % BUCKET_MS) - (BUCKETS - 1) * BUCKET_MS;
    for (const start of this.buckets.keys()) if (start < oldest) this.buckets.delete(start);
  }
}
