import type { KeyLimits } from "./key-rules.ts";

/**
 * A sliding one-minute window made of one-second buckets: enough precision
 * for RPM/TPM (at most a second's worth of slack at the window edge) with
 * constant memory per key. Pure; the KeyLedger Durable Object hosts it.
 */
export class SlidingWindow {
  private readonly counts: number[];
  private readonly stamps: number[];

  constructor(
    readonly windowMs = 60_000,
    readonly buckets = 60,
  ) {
    this.counts = new Array(buckets).fill(0);
    this.stamps = new Array(buckets).fill(-1);
  }

  private get bucketMs(): number {
    return this.windowMs / this.buckets;
  }

  add(now: number, n: number): void {
    const slot = Math.floor(now / this.bucketMs);
    const i = slot % this.buckets;
    if (this.stamps[i] !== slot) {
      this.stamps[i] = slot;
      this.counts[i] = 0;
    }
    this.counts[i]! += n;
  }

  sum(now: number): number {
    const slot = Math.floor(now / this.bucketMs);
    let s = 0;
    for (let i = 0; i < this.buckets; i++) {
      const st = this.stamps[i]!;
      if (st > slot - this.buckets && st <= slot) s += this.counts[i]!;
    }
    return s;
  }

  /** Milliseconds until the sum drops to at most `target` if nothing is added. */
  msUntilAtMost(now: number, target: number): number {
    const slot = Math.floor(now / this.bucketMs);
    let s = this.sum(now);
    if (s <= target) return 0;
    for (let age = this.buckets - 1; age >= 0; age--) {
      const st = slot - age;
      const i = ((st % this.buckets) + this.buckets) % this.buckets;
      if (this.stamps[i] === st) s -= this.counts[i]!;
      if (s <= target) return (st + this.buckets) * this.bucketMs - now;
    }
    return this.windowMs;
  }
}

export type AdmitResult =
  | { ok: true }
  | { ok: false; reason: "revoked" }
  | { ok: false; reason: "rpm" | "tpm" | "budget"; retryAfterMs: number; limit: number };

export interface BudgetState {
  periodStart: number;
  used: number;
}

/** Fixed budget periods aligned to the epoch, so every isolate and the ledger agree on them. */
export function budgetPeriodStart(now: number, periodMs: number): number {
  return periodMs > 0 ? Math.floor(now / periodMs) * periodMs : 0;
}

/**
 * Whether a request may start. RPM counts requests admitted in the last
 * minute; TPM and the budget count tokens already charged, because a
 * request's tokens are known only at its end. So the request that crosses a
 * limit completes and the next one is refused — concurrent requests can
 * overshoot by what they generate together.
 */
export function admit(
  limits: KeyLimits,
  requests: SlidingWindow,
  tokens: SlidingWindow,
  budget: BudgetState,
  now: number,
): AdmitResult {
  if (limits.budgetTokens > 0 && limits.budgetPeriodMs > 0) {
    const start = budgetPeriodStart(now, limits.budgetPeriodMs);
    const used = budget.periodStart === start ? budget.used : 0;
    if (used >= limits.budgetTokens) {
      return {
        ok: false,
        reason: "budget",
        retryAfterMs: start + limits.budgetPeriodMs - now,
        limit: limits.budgetTokens,
      };
    }
  }
  if (limits.rpm > 0 && requests.sum(now) >= limits.rpm) {
    return {
      ok: false,
      reason: "rpm",
      retryAfterMs: Math.max(1, requests.msUntilAtMost(now, limits.rpm - 1)),
      limit: limits.rpm,
    };
  }
  if (limits.tpm > 0 && tokens.sum(now) >= limits.tpm) {
    return {
      ok: false,
      reason: "tpm",
      retryAfterMs: Math.max(1, tokens.msUntilAtMost(now, limits.tpm - 1)),
      limit: limits.tpm,
    };
  }
  return { ok: true };
}
