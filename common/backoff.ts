/**
 * Exponential backoff with full jitter (AWS architecture blog's "full
 * jitter"): the delay is uniform in [0, min(cap, base * 2^attempt)). Full
 * jitter, not ±30 %, so that a fleet that lost its control plane at the same
 * instant does not come back in lockstep and knock it over again.
 */
export interface BackoffOptions {
  baseMs: number;
  maxMs: number;
  random?: () => number;
}

export class Backoff {
  private attempt = 0;
  constructor(private readonly opts: BackoffOptions) {}

  /** The ceiling of the next delay, before jitter. */
  ceiling(): number {
    return Math.min(this.opts.maxMs, this.opts.baseMs * 2 ** this.attempt);
  }

  next(): number {
    const cap = this.ceiling();
    this.attempt++;
    return Math.floor((this.opts.random ?? Math.random)() * cap);
  }

  reset(): void {
    this.attempt = 0;
  }

  get attempts(): number {
    return this.attempt;
  }
}

/** Plain doubling without jitter, for restarts of one process where lockstep is not a concern. */
export function doublingDelay(failures: number, baseMs: number, maxMs: number): number {
  if (failures <= 0) return 0;
  return Math.min(maxMs, baseMs * 2 ** (failures - 1));
}
