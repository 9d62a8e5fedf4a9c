import { describe, expect, it } from "vitest";
import {
  estimateTokens,
  OPEN_ENDED_COMPLETION_TOKENS,
  OpenReservations,
  RESERVATION_GRACE_MS,
  reservationFor,
} from "./reservations.ts";

describe("reservations", () => {
  it("bounds a request by its body bytes plus n × max_tokens, or assumes OPEN_ENDED_COMPLETION_TOKENS", () => {
    expect(estimateTokens({ max_tokens: 8 }, 100, true)).toBe(108);
    expect(estimateTokens({ max_tokens: 8, n: 3 }, 100, true)).toBe(124);
    expect(estimateTokens({ max_tokens: 8, max_completion_tokens: 20 }, 100, true)).toBe(120);
    expect(estimateTokens({ max_tokens: 30, max_completion_tokens: 20 }, 100, true)).toBe(130);
    expect(estimateTokens({}, 100, true)).toBe(100 + OPEN_ENDED_COMPLETION_TOKENS);
    expect(estimateTokens({ max_tokens: null }, 100, true)).toBe(100 + OPEN_ENDED_COMPLETION_TOKENS);
    // Embeddings: the prompt only.
    expect(estimateTokens({ max_tokens: 8 }, 100, false)).toBe(100);
    expect(reservationFor("req_1", { max_tokens: 8 }, 100, true, 1_800_000)).toEqual({
      id: "req_1",
      tokens: 108,
      ttlMs: 1_800_000 + RESERVATION_GRACE_MS,
    });
  });
  it("keeps the sum of what is open, closes each once, and expires what a dead Worker left", () => {
    const r = new OpenReservations([{ id: "a", tokens: 10, expiresAt: 1_000 }]);
    r.open({ id: "b", tokens: 5, expiresAt: 2_000 });
    r.open({ id: "b", tokens: 7, expiresAt: 2_000 }); // reopened: replaced, not added twice
    expect(r.tokens()).toBe(17);
    expect(r.nextExpiry()).toBe(1_000);
    expect(r.close("a")).toBe(true);
    expect(r.close("a")).toBe(false);
    expect(r.close("never")).toBe(false);
    expect(r.tokens()).toBe(7);
    expect(r.expire(1_999)).toBe(0);
    expect(r.expire(2_000)).toBe(1);
    expect(r.tokens()).toBe(0);
    expect(r.size).toBe(0);
    expect(r.nextExpiry()).toBeUndefined();
  });
});
