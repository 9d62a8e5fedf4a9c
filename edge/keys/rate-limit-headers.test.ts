import { describe, expect, it } from "vitest";
import { rateLimitHeaders, resetText } from "./rate-limit-headers.ts";

describe("x-ratelimit-* headers", () => {
  it("writes resets as OpenAI does", () => {
    expect([0, 0.4, 20, 999, 1_000, 1_500, 17_280, 59_999, 60_000, 61_250].map(resetText)).toEqual([
      "0ms",
      "1ms",
      "20ms",
      "999ms",
      "1s",
      "1.5s",
      "17.28s",
      "59.999s",
      "1m0s",
      "1m1.25s",
    ]);
  });

  it("names only the limits the key has", () => {
    expect(rateLimitHeaders(undefined)).toEqual({});
    expect(rateLimitHeaders({ tokens: { limit: 1000, remaining: 981, resetMs: 59_000 } })).toEqual({
      "x-ratelimit-limit-tokens": "1000",
      "x-ratelimit-remaining-tokens": "981",
      "x-ratelimit-reset-tokens": "59s",
    });
    expect(Object.keys(rateLimitHeaders({ requests: { limit: 3, remaining: 2, resetMs: 10 } }))).toEqual([
      "x-ratelimit-limit-requests",
      "x-ratelimit-remaining-requests",
      "x-ratelimit-reset-requests",
    ]);
  });
});
