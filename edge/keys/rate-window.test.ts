import { describe, expect, it } from "vitest";
import {
  ADMIT_WAIT_MS,
  admit,
  budgetPeriodStart,
  holdsReservations,
  type LedgerView,
  PENDING_RETRY_MS,
  rateLimitsOf,
  SlidingWindow,
  waitBeforeRetry,
} from "./rate-window.ts";

describe("rate windows and admission", () => {
  const limits = { rpm: 2, tpm: 100, budgetTokens: 0, budgetPeriodMs: 0, maxConcurrent: 0 };
  const view = (v: Partial<LedgerView> = {}): LedgerView => ({
    requests: new SlidingWindow(),
    tokens: new SlidingWindow(),
    budget: { periodStart: 0, used: 0 },
    reserved: 0,
    inFlight: 0,
    ...v,
  });
  it("refuses at max_concurrent requests in flight, at once, and admits once one has finished", () => {
    const capped = { ...limits, rpm: 0, tpm: 0, maxConcurrent: 2 };
    const r = admit(capped, view({ inFlight: 2 }), 1_000);
    expect(r).toMatchObject({ ok: false, reason: "concurrency", limit: 2, retryAfterMs: PENDING_RETRY_MS });
    if (!r.ok) expect(waitBeforeRetry(r, 1_000, 1_000 + ADMIT_WAIT_MS, undefined)).toBeUndefined();
    expect(admit(capped, view({ inFlight: 1 }), 1_000).ok).toBe(true);
  });
  it("says where a key stands against RPM and TPM: reservations count as taken, the reset is when the window empties", () => {
    const v = view({ reserved: 30 });
    v.requests.add(1_000, 1);
    v.requests.add(30_500, 1);
    v.tokens.add(30_500, 50);
    expect(rateLimitsOf(limits, v, 31_000)).toEqual({
      requests: { limit: 2, remaining: 0, resetMs: 59_000 },
      // A request is running: its tokens will enter the window when charged, and stay a minute.
      tokens: { limit: 100, remaining: 20, resetMs: 60_000 },
    });
    expect(rateLimitsOf(limits, { ...v, reserved: 0 }, 31_000)?.tokens).toEqual({
      limit: 100,
      remaining: 50,
      resetMs: 59_000,
    });
    // Over the limit (a request that crossed it completes): nothing remains, never less.
    v.tokens.add(31_000, 100);
    expect(rateLimitsOf(limits, v, 31_000)?.tokens?.remaining).toBe(0);
    expect(rateLimitsOf({ ...limits, tpm: 0 }, v, 31_000)).not.toHaveProperty("tokens");
    expect(rateLimitsOf({ ...limits, rpm: 0, tpm: 0, maxConcurrent: 3 }, v, 31_000)).toBeUndefined();
  });
  it("refuses past RPM until the window slides, with a Retry-After", () => {
    const v = view();
    v.requests.add(1_000, 1);
    v.requests.add(30_500, 1);
    const r = admit(limits, v, 31_000);
    expect(r).toMatchObject({ ok: false, reason: "rpm" });
    if (!r.ok && r.reason === "rpm") expect(r.retryAfterMs).toBe(30_000);
    expect(admit(limits, v, 61_000).ok).toBe(true);
  });
  it("says when the window frees enough for one request, to the millisecond of its one-second buckets", () => {
    const v = view();
    v.requests.add(10_250, 1);
    v.requests.add(10_900, 1);
    // Both in the bucket of second 10, which leaves the window at 70 s.
    expect(admit(limits, v, 10_950)).toMatchObject({ reason: "rpm", retryAfterMs: 59_050 });
    expect(admit(limits, v, 69_999)).toMatchObject({ reason: "rpm", retryAfterMs: 1 });
    expect(admit(limits, v, 70_000).ok).toBe(true);
  });
  it("refuses past TPM and past the budget of the current period only", () => {
    const v = view();
    v.tokens.add(0, 150);
    expect(admit(limits, v, 10)).toMatchObject({ reason: "tpm", retryAfterMs: 59_990 });
    const b = { rpm: 0, tpm: 0, budgetTokens: 10, budgetPeriodMs: 86_400_000, maxConcurrent: 0 };
    const spent = view({ budget: { periodStart: 0, used: 10 } });
    expect(admit(b, spent, 1000)).toMatchObject({ reason: "budget", retryAfterMs: 86_399_000 });
    expect(admit(b, spent, 86_400_001).ok).toBe(true);
    expect(budgetPeriodStart(86_400_001, 86_400_000)).toBe(86_400_000);
  });
  it("admits a budget key while charged plus reserved is under the budget, so only the crossing request runs past it", () => {
    const b = { rpm: 0, tpm: 0, budgetTokens: 30, budgetPeriodMs: 86_400_000, maxConcurrent: 0 };
    const at = (used: number, reserved: number) =>
      admit(b, view({ budget: { periodStart: 0, used }, reserved }), 1_000);
    expect(at(0, 0).ok).toBe(true);
    // The first request (reserved 29) may not have crossed: the second is admitted.
    expect(at(0, 29).ok).toBe(true);
    // Reservations that could reach the budget: decided once they are charged.
    expect(at(0, 30)).toMatchObject({
      ok: false,
      reason: "pending",
      of: "budget",
      retryAfterMs: PENDING_RETRY_MS,
    });
    expect(at(19, 11)).toMatchObject({ reason: "pending" });
    // Charged 19 of 30, nothing running: the request that will cross starts.
    expect(at(19, 0).ok).toBe(true);
    // Charged 38: spent, whatever is running.
    expect(at(38, 0)).toMatchObject({ reason: "budget" });
    expect(at(38, 500)).toMatchObject({ reason: "budget" });
  });
  it("counts reservations against TPM, and its Retry-After waits for the window to free room beside them", () => {
    const t = { rpm: 0, tpm: 100, budgetTokens: 0, budgetPeriodMs: 0, maxConcurrent: 0 };
    const v = view({ reserved: 40 });
    v.tokens.add(5_000, 30);
    v.tokens.add(20_000, 40);
    // 70 charged + 40 running ≥ 100: pending; the window frees room for 40 when second 5 leaves it.
    expect(admit(t, v, 21_000)).toMatchObject({
      reason: "pending",
      of: "tpm",
      retryAfterMs: PENDING_RETRY_MS,
    });
    expect(admit(t, v, 64_500)).toMatchObject({ reason: "pending", retryAfterMs: 500 });
    expect(admit(t, v, 65_000).ok).toBe(true);
    v.tokens.add(21_000, 40);
    // 110 charged: refused outright, until 70 − 60 ≤ 100 − 1 − 40: second 20 leaves at 80 s.
    expect(admit(t, v, 22_000)).toMatchObject({ reason: "tpm", retryAfterMs: 58_000 });
  });
  it("holds reservations only for TPM and budget keys", () => {
    const none = { rpm: 0, tpm: 0, budgetTokens: 0, budgetPeriodMs: 0, maxConcurrent: 0 };
    expect(holdsReservations({ ...none, rpm: 5 })).toBe(false);
    expect(holdsReservations({ ...none, tpm: 5 })).toBe(true);
    expect(holdsReservations({ ...none, budgetTokens: 5, budgetPeriodMs: 1, maxConcurrent: 0 })).toBe(true);
    expect(holdsReservations({ ...none, maxConcurrent: 2 })).toBe(true);
  });
  it("waits for a pending decision until a reservation closes or expires, its retry time, or the deadline", () => {
    const pending = { ok: false, reason: "pending", of: "budget", retryAfterMs: 1_000, limit: 30 } as const;
    expect(waitBeforeRetry(pending, 0, ADMIT_WAIT_MS, undefined)).toBe(1_000);
    expect(waitBeforeRetry(pending, 0, 300, undefined)).toBe(300);
    expect(waitBeforeRetry(pending, 0, ADMIT_WAIT_MS, 50)).toBe(50);
    expect(waitBeforeRetry(pending, 0, ADMIT_WAIT_MS, -5)).toBe(1);
    expect(waitBeforeRetry(pending, ADMIT_WAIT_MS, ADMIT_WAIT_MS, undefined)).toBeUndefined();
    const spent = { ok: false, reason: "budget", retryAfterMs: 1_000, limit: 30 } as const;
    expect(waitBeforeRetry(spent, 0, ADMIT_WAIT_MS, undefined)).toBeUndefined();
  });
});
