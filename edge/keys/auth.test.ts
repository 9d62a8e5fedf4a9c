import { describe, expect, it } from "vitest";
import { KeyCache } from "./auth.ts";
import type { KeyRecord } from "./rules.ts";

const key = { id: "k1" } as KeyRecord;

/**
 * The per-isolate key cache with its clock in the test's hands: a known key
 * past its TTL is served while one caller re-reads it, so no request waits
 * on KV for a key in use; an unknown one, and a known one long past, are
 * read before their request goes on.
 */
describe("KeyCache", () => {
  it("serves a known key past its TTL while exactly one caller re-reads it", () => {
    let now = 0;
    const cache = new KeyCache(() => now);
    expect(cache.get("h")).toBeUndefined();
    cache.set("h", key);
    expect(cache.get("h")).toEqual({ key, reread: false });
    now = 10_001;
    expect(cache.get("h")).toEqual({ key, reread: true });
    expect(cache.get("h")).toEqual({ key, reread: false });
    cache.set("h", key);
    now = 20_000;
    expect(cache.get("h")).toEqual({ key, reread: false });
  });

  it("lets the next caller re-read when a re-read failed", () => {
    let now = 0;
    const cache = new KeyCache(() => now);
    cache.set("h", key);
    now = 10_001;
    expect(cache.get("h")?.reread).toBe(true);
    cache.abandon("h");
    expect(cache.get("h")?.reread).toBe(true);
  });

  it("makes the caller wait for KV when the key was unknown, or known too long ago", () => {
    let now = 0;
    const cache = new KeyCache(() => now);
    cache.set("unknown", null);
    cache.set("old", key);
    now = 2_001;
    // Unknown: one caller reads (and waits), the others keep the old answer meanwhile.
    expect(cache.get("unknown")).toBeUndefined();
    expect(cache.get("unknown")).toEqual({ key: null, reread: false });
    now = 10_000 + 60_001;
    expect(cache.get("old")).toBeUndefined();
  });
});
