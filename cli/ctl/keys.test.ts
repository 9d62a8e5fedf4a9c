import { describe, expect, it } from "vitest";
import { expired } from "../../common/key-expiry.ts";
import { parseExpiry } from "./keys.ts";

describe("key expiry", () => {
  const now = Date.parse("2026-12-07T12:00:00Z");

  it("reads --expires as a duration from now or as a date, never only where it may lift one", () => {
    expect(parseExpiry("30d", now, false)).toBe(BigInt(now + 30 * 86_400_000));
    expect(parseExpiry("2027-01-31", now, false)).toBe(BigInt(Date.parse("2027-01-31T00:00:00Z")));
    expect(parseExpiry("2027-01-31T09:30:00+01:00", now, false)).toBe(
      BigInt(Date.parse("2027-01-31T08:30:00Z")),
    );
    expect(parseExpiry("never", now, true)).toBe(0n);
    expect(parseExpiry(undefined, now, true)).toBeUndefined();
    expect(() => parseExpiry("never", now, false)).toThrow(/got "never"/);
    expect(() => parseExpiry("2026-12-07", now, false)).toThrow(
      /2026-12-07T00:00:00.000Z is not in the future/,
    );
    expect(() => parseExpiry("2027-02-30x", now, false)).toThrow(/expected a duration/);
    // A day that does not exist, and a time whose zone would be this machine's guess.
    expect(() => parseExpiry("2027-02-30", now, false)).toThrow(/expected a duration/);
    expect(() => parseExpiry("2027-01-31T09:00", now, false)).toThrow(/a time with its zone/);
    expect(() => parseExpiry("2027-02-30T09:00:00Z", now, false)).toThrow(/expected a duration/);
    expect(parseExpiry("2027-01-31T23:30:00-02:00", now, false)).toBe(
      BigInt(Date.parse("2027-02-01T01:30:00Z")),
    );
    // Past the year 9999 no date can be written.
    expect(() => parseExpiry("100000001d", now, false)).toThrow(/past the year 9999/);
  });

  it("a key expires at its instant, and one without an expiry never does", () => {
    const at = now + 1_000;
    expect([expired({ expires_at_unix_ms: at }, at - 1), expired({ expires_at_unix_ms: at }, at)]).toEqual([
      false,
      true,
    ]);
    expect(expired({ expires_at_unix_ms: 0 }, Number.MAX_SAFE_INTEGER)).toBe(false);
  });
});
