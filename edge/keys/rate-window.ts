import type { KeyLimits } from "./rules.ts";

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

/** Where a key stands against one per-minute limit, as OpenAI's `x-ratelimit-*` headers say it. */
export interface RateStanding {
  limit: number;
  remaining: number;
  /** Until the window holds nothing, if nothing more is added. */
  resetMs: number;
}

/** The key's standing against its RPM and TPM, each only if the key has it. */
export interface RateLimits {
  requests?: RateStanding;
  tokens?: RateStanding;
}

export type AdmitResult =
  | { ok: true }
  | { ok: false; reason: "revoked" }
  | { ok: false; reason: "rpm" | "tpm" | "budget" | "concurrency"; retryAfterMs: number; limit: number }
  | {
      ok: false;
      /** What is charged is under the limit, but what is running could reach it. */
      reason: "pending";
      of: "budget" | "tpm";
      retryAfterMs: number;
      limit: number;
    };

export type AdmitRefusal = Exclude<AdmitResult, { ok: true }>;

export interface BudgetState {
  periodStart: number;
  used: number;
}

/** What a key's ledger knows at an admission. */
export interface LedgerView {
  /** Requests admitted, per second of the last minute. */
  requests: SlidingWindow;
  /** Tokens charged, per second of the last minute. */
  tokens: SlidingWindow;
  budget: BudgetState;
  /** Tokens held by open reservations: admitted requests whose charge has not landed (reservations.ts). */
  reserved: number;
  /** Open reservations: requests admitted whose charge has not landed — the key's requests in flight. */
  inFlight: number;
}

/**
 * How long an admission may wait for running requests' charges before it
 * gives up with a `pending` refusal. A request that ended is charged within
 * tens of milliseconds (charge-batcher), so back-to-back requests are
 * decided on what the previous one really used; a request still running
 * longer than this makes the next one retry instead.
 */
export const ADMIT_WAIT_MS = 2_000;

/** Retry-After of a `pending` refusal: when running requests may have ended. */
export const PENDING_RETRY_MS = 1_000;

/** Fixed budget periods aligned to the epoch, so every isolate and the ledger agree on them. */
export function budgetPeriodStart(now: number, periodMs: number): number {
  return periodMs > 0 ? Math.floor(now / periodMs) * periodMs : 0;
}

/**
 * Whether a request may start. RPM counts requests admitted in the last
 * minute. TPM and the budget count tokens charged, and the tokens reserved
 * for requests admitted but not yet charged. A request is admitted while
 * what is charged plus what is reserved is under the limit: even if every
 * running request used all it reserved, the limit would not have been
 * crossed before this one started. So the request that crosses a limit
 * completes, and nothing starts after it — even before its charge lands.
 *
 * The refusals: `budget`/`rpm`/`tpm` when what is charged (or admitted) has
 * reached the limit; `pending` when only the reservations could reach it —
 * the ledger then waits for charges (waitBeforeRetry) and decides again;
 * `concurrency` when the key has `maxConcurrent` requests in flight, which
 * is answered at once: a client that holds that many streams is told so
 * rather than queued behind itself.
 */
export function admit(limits: KeyLimits, view: LedgerView, now: number): AdmitResult {
  const hasBudget = limits.budgetTokens > 0 && limits.budgetPeriodMs > 0;
  const start = budgetPeriodStart(now, limits.budgetPeriodMs);
  const spent = hasBudget && view.budget.periodStart === start ? view.budget.used : 0;
  if (hasBudget && spent >= limits.budgetTokens) {
    return {
      ok: false,
      reason: "budget",
      retryAfterMs: start + limits.budgetPeriodMs - now,
      limit: limits.budgetTokens,
    };
  }
  if (limits.maxConcurrent > 0 && view.inFlight >= limits.maxConcurrent) {
    return { ok: false, reason: "concurrency", retryAfterMs: PENDING_RETRY_MS, limit: limits.maxConcurrent };
  }
  if (limits.rpm > 0 && view.requests.sum(now) >= limits.rpm) {
    return {
      ok: false,
      reason: "rpm",
      retryAfterMs: Math.max(1, view.requests.msUntilAtMost(now, limits.rpm - 1)),
      limit: limits.rpm,
    };
  }
  const perMinute = limits.tpm > 0 ? view.tokens.sum(now) : 0;
  // The window must free enough that what it still holds plus what is
  // reserved is under the limit.
  const tpmFree = () =>
    Math.max(1, view.tokens.msUntilAtMost(now, Math.max(0, limits.tpm - 1 - view.reserved)));
  if (limits.tpm > 0 && perMinute >= limits.tpm) {
    return { ok: false, reason: "tpm", retryAfterMs: tpmFree(), limit: limits.tpm };
  }
  if (hasBudget && spent + view.reserved >= limits.budgetTokens) {
    return {
      ok: false,
      reason: "pending",
      of: "budget",
      retryAfterMs: PENDING_RETRY_MS,
      limit: limits.budgetTokens,
    };
  }
  if (limits.tpm > 0 && perMinute + view.reserved >= limits.tpm) {
    return {
      ok: false,
      reason: "pending",
      of: "tpm",
      retryAfterMs: view.reserved < limits.tpm ? Math.min(PENDING_RETRY_MS, tpmFree()) : PENDING_RETRY_MS,
      limit: limits.tpm,
    };
  }
  return { ok: true };
}

/**
 * The key's standing once an admission is decided (the admitted request
 * counted): tokens remaining are what neither charges nor running
 * requests' reservations have taken, as admission itself counts them; with
 * requests running, the tokens' reset is at least a window away. Undefined
 * for a key with neither RPM nor TPM.
 */
export function rateLimitsOf(
  limits: KeyLimits,
  view: Pick<LedgerView, "requests" | "tokens" | "reserved">,
  now: number,
): RateLimits | undefined {
  if (limits.rpm <= 0 && limits.tpm <= 0) return undefined;
  const out: RateLimits = {};
  if (limits.rpm > 0) {
    const used = view.requests.sum(now);
    out.requests = {
      limit: limits.rpm,
      remaining: Math.max(0, limits.rpm - used),
      resetMs: view.requests.msUntilAtMost(now, 0),
    };
  }
  if (limits.tpm > 0) {
    const used = view.tokens.sum(now) + view.reserved;
    out.tokens = {
      limit: limits.tpm,
      remaining: Math.max(0, limits.tpm - used),
      // Running requests' tokens enter the window when they are charged and stay a whole window.
      resetMs: view.reserved > 0 ? view.tokens.windowMs : view.tokens.msUntilAtMost(now, 0),
    };
  }
  return out;
}

/**
 * Whether a key's admissions hold reservations until their charge: TPM and
 * the budget count their tokens, `maxConcurrent` counts them.
 */
export function holdsReservations(limits: KeyLimits): boolean {
  return limits.tpm > 0 || (limits.budgetTokens > 0 && limits.budgetPeriodMs > 0) || limits.maxConcurrent > 0;
}

/**
 * How long to wait before deciding a refused admission again, or undefined
 * to answer it now. Only a `pending` refusal waits, and only until the
 * deadline: until a reservation closes (the ledger wakes the wait early),
 * the next one expires, or the refusal's own retry time — a TPM window
 * sliding — comes round.
 */
export function waitBeforeRetry(
  r: AdmitRefusal,
  now: number,
  deadline: number,
  nextExpiry: number | undefined,
): number | undefined {
  if (r.reason !== "pending" || now >= deadline) return undefined;
  const until = Math.min(deadline, now + r.retryAfterMs, nextExpiry ?? Number.POSITIVE_INFINITY);
  return Math.max(1, until - now);
}
