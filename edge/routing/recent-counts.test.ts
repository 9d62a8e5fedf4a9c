import { describe, expect, it } from "vitest";
import { RecentCounts } from "./recent-counts.ts";

describe("RecentCounts", () => {
  it("counts each key over the last minute and forgets what is older", () => {
    const c = new RecentCounts();
    c.add("a", 0);
    c.add("a", 5_000);
    c.add("b", 25_000);
    expect(c.snapshot(30_000)).toEqual({ a: 2, b: 1 });
    // At 60 s the bucket of 0-10 s has left the window; b's is still in it.
    expect(c.snapshot(60_000)).toEqual({ b: 1 });
    c.add("a", 61_000);
    expect(c.snapshot(85_000)).toEqual({ a: 1 });
    expect(c.snapshot(200_000)).toEqual({});
  });
});
