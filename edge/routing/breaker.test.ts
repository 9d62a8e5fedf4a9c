import { describe, expect, it } from "vitest";
import { Breakers } from "./breaker.ts";

describe("Breakers", () => {
  it("opens after threshold consecutive failures, probes once after cooldown, closes on success", () => {
    let now = 0;
    const b = new Breakers(3, 1000, () => now);
    b.onFailure("e");
    b.onFailure("e");
    expect(b.state("e")).toBe("closed");
    b.onSuccess("e"); // consecutive: a success resets the count
    b.onFailure("e");
    b.onFailure("e");
    expect(b.canTry("e")).toBe(true);
    b.onFailure("e");
    expect(b.state("e")).toBe("open");
    expect(b.canTry("e")).toBe(false);
    now = 1000;
    expect(b.state("e")).toBe("half-open");
    expect(b.canTry("e")).toBe(true);
    b.onAttempt("e");
    expect(b.canTry("e")).toBe(false); // one probe at a time
    b.onFailure("e");
    expect(b.state("e")).toBe("open"); // failed probe: another cooldown
    now = 2000;
    b.onAttempt("e");
    b.onSuccess("e");
    expect(b.state("e")).toBe("closed");
  });

  it("lets another probe through when one is abandoned", () => {
    let now = 0;
    const b = new Breakers(1, 10, () => now);
    b.onFailure("e");
    now = 10;
    b.onAttempt("e");
    b.onAbandon("e");
    expect(b.canTry("e")).toBe(true);
  });
});

describe("why a breaker opened", () => {
  it("keeps the last failure's reason while open, and forgets it on success", () => {
    let now = 0;
    const b = new Breakers(2, 1_000, () => now);
    expect(b.onFailure("e", "upstream_unreachable: refused")).toBe(false);
    expect(b.reason("e")).toBeNull();
    expect(b.onFailure("e", "first_token_timeout: no token")).toBe(true);
    expect([b.state("e"), b.reason("e"), b.failures("e")]).toEqual([
      "open",
      "first_token_timeout: no token",
      2,
    ]);
    now = 1_000;
    b.onAttempt("e");
    expect(b.onFailure("e", "upstream_disconnected: cut")).toBe(true); // the probe failed: open again
    expect(b.reason("e")).toBe("upstream_disconnected: cut");
    b.onSuccess("e");
    expect([b.state("e"), b.reason("e")]).toEqual(["closed", null]);
  });
});
