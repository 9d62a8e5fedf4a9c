import { describe, expect, it } from "vitest";
import { checkpoints, PrefixIndex } from "./prefix-index.ts";

const all = () => true;
/** A prompt's chained hashes: prompts sharing a start share those hashes (here: equal numbers). */
const prompt = (start: number, shared: number, own: number, total: number) =>
  Array.from({ length: total }, (_, i) => (i < shared ? start * 1000 + i : own * 1_000_000 + i));

describe("PrefixIndex", () => {
  it("keeps the first 16 blocks, two checkpoints per doubling after, and the last", () => {
    expect(checkpoints(5)).toEqual([0, 1, 2, 3, 4]);
    expect(checkpoints(100)).toEqual([
      ...Array.from({ length: 16 }, (_, i) => i),
      16,
      24,
      32,
      48,
      64,
      96,
      99,
    ]);
    expect(checkpoints(256)).toEqual([
      ...Array.from({ length: 16 }, (_, i) => i),
      16,
      24,
      32,
      48,
      64,
      96,
      128,
      192,
      255,
    ]);
  });

  it("finds the longest leading run each endpoint holds, longest first, to a checkpoint's precision", () => {
    const idx = new PrefixIndex(10_000);
    idx.record("a", prompt(1, 200, 1, 256));
    idx.record("b", prompt(1, 40, 2, 256));
    idx.record("c", prompt(2, 256, 3, 256));
    expect(idx.match(prompt(1, 256, 9, 256), all)).toEqual([
      // a holds blocks 0..199 of this prompt: the last checkpoint inside is 192.
      { blocks: 193, endpoints: ["a"] },
      { blocks: 33, endpoints: ["a", "b"] },
    ]);
    expect(idx.match(prompt(7, 0, 7, 50), all)).toEqual([]);
  });

  it("only considers eligible endpoints", () => {
    const idx = new PrefixIndex(10_000);
    idx.record("a", prompt(1, 20, 1, 20));
    idx.record("b", prompt(1, 10, 2, 20));
    expect(idx.match(prompt(1, 20, 1, 20), (id) => id !== "a")).toEqual([{ blocks: 10, endpoints: ["b"] }]);
  });

  it("drops the old generation once the young one holds half the capacity; what is touched again stays", () => {
    const idx = new PrefixIndex(40);
    const system = prompt(1, 8, 1, 8);
    idx.record("a", system);
    idx.record("a", prompt(2, 0, 2, 8));
    for (let k = 3; k < 10; k++) {
      idx.record("a", system);
      idx.record("a", prompt(k, 0, k, 8));
      expect(idx.blocksHeld("a")).toBeLessThanOrEqual(40);
    }
    expect(idx.match(system, all)).toEqual([{ blocks: 8, endpoints: ["a"] }]);
    expect(idx.match(prompt(9, 0, 9, 8), all)).toEqual([{ blocks: 8, endpoints: ["a"] }]);
    expect(idx.match(prompt(2, 0, 2, 8), all)).toEqual([]);
  });

  it("forgets an endpoint that left, and records nothing at capacity 0", () => {
    const idx = new PrefixIndex(100);
    idx.record("a", [1, 2]);
    idx.forget("a");
    expect(idx.match([1, 2], all)).toEqual([]);
    const none = new PrefixIndex(0);
    none.record("a", [1, 2]);
    expect(none.match([1, 2], all)).toEqual([]);
  });

  it("one endpoint's held run is what match finds for it alone", () => {
    const idx = new PrefixIndex(10_000);
    const hashes = Array.from({ length: 40 }, (_, i) => 500 + i);
    idx.record("a", hashes.slice(0, 30));
    idx.record("b", hashes);
    for (const id of ["a", "b"]) {
      const alone = idx.match(hashes, (e) => e === id)[0]?.blocks ?? 0;
      expect(idx.heldRun(id, hashes)).toBe(alone);
    }
    expect(idx.heldRun("b", hashes)).toBe(40);
    expect(idx.heldRun("c", hashes)).toBe(0);
    expect(idx.heldRun("a", [9, ...hashes])).toBe(0);
  });
});
