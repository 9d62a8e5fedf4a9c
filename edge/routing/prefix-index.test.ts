import { describe, expect, it } from "vitest";
import { PrefixIndex } from "./prefix-index.ts";

const all = () => true;

describe("PrefixIndex", () => {
  it("finds the endpoints holding the longest leading run, with the shorter levels after it", () => {
    const idx = new PrefixIndex(100);
    idx.record("a", [1, 2, 3, 4]);
    idx.record("b", [1, 2, 9]);
    idx.record("c", [7]);
    expect(idx.match([1, 2, 3, 5], all)).toEqual([
      { blocks: 3, endpoints: ["a"] },
      { blocks: 2, endpoints: ["a", "b"] },
    ]);
    expect(idx.match([7, 1], all)).toEqual([{ blocks: 1, endpoints: ["c"] }]);
    expect(idx.match([5, 1], all)).toEqual([]);
  });

  it("only considers eligible endpoints", () => {
    const idx = new PrefixIndex(100);
    idx.record("a", [1, 2, 3]);
    idx.record("b", [1, 2]);
    expect(idx.match([1, 2, 3], (id) => id !== "a")).toEqual([{ blocks: 2, endpoints: ["b"] }]);
  });

  it("evicts least recently used blocks per endpoint, a prompt's tail before its beginning", () => {
    const idx = new PrefixIndex(4);
    idx.record("a", [1, 2, 3]);
    idx.record("a", [9, 8]);
    // Five blocks for four places: the first prompt's tail (3) went first.
    expect(idx.blocksHeld("a")).toBe(4);
    expect(idx.match([1, 2, 3], all)).toEqual([{ blocks: 2, endpoints: ["a"] }]);
    expect(idx.match([9, 8], all)).toEqual([{ blocks: 2, endpoints: ["a"] }]);
  });

  it("shrinks to a new capacity and forgets an endpoint that left", () => {
    const idx = new PrefixIndex(10);
    idx.record("a", [1, 2, 3, 4]);
    idx.record("b", [1, 2]);
    idx.setCapacity(2);
    expect(idx.match([1, 2, 3, 4], all)).toEqual([{ blocks: 2, endpoints: ["a", "b"] }]);
    idx.forget("a");
    expect(idx.match([1, 2], all)).toEqual([{ blocks: 2, endpoints: ["b"] }]);
    expect(idx.blocksHeld("a")).toBe(0);
  });

  it("records nothing at capacity 0", () => {
    const idx = new PrefixIndex(0);
    idx.record("a", [1, 2]);
    expect(idx.match([1, 2], all)).toEqual([]);
  });
});
