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
