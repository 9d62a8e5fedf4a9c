import { describe, expect, it } from "vitest";
import { KvCache } from "./kv-cache.ts";

const hashes = (tokens: number[], bs: number) => {
  const out: number[] = [];
  for (let j = 0; (j + 1) * bs <= tokens.length; j++)
    out.push(KvCache.blockHash(j ? out[j - 1]! : 0, tokens, j * bs, bs));
  return out;
};

describe("KvCache", () => {
  it("chains block hashes so one hash names the whole prefix", () => {
    const a = hashes([1, 2, 3, 4, 5, 6, 7, 8], 4);
    const b = hashes([1, 2, 3, 4, 5, 6, 7, 8], 4);
    const c = hashes([9, 2, 3, 4, 5, 6, 7, 8], 4);
    expect(a).toEqual(b);
    expect(c[1]).not.toBe(a[1]); // same second block, different parent
  });

  it("allocates, counts usage and refuses what it cannot hold", () => {
    const kv = new KvCache(4, 16);
    const got = kv.allocate(3)!;
    expect(got).toHaveLength(3);
    expect(kv.freeBlocks).toBe(1);
    expect(kv.usage()).toBe(0.75);
    expect(kv.allocate(2)).toBeUndefined();
    kv.release(got);
    expect(kv.freeBlocks).toBe(4);
    expect(kv.usage()).toBe(0);
  });

  it("serves a released prefix again from cache, with references counted", () => {
    const kv = new KvCache(8, 4);
    const h = hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4);
    const blocks = kv.allocate(3)!;
    for (const [i, b] of blocks.entries()) kv.commit(b, h[i]!);
    kv.release(blocks);
    expect(kv.cachedBlockCount()).toBe(3);
    const hit = kv.lookup([h[0]!, h[1]!, 12345]);
    expect(hit).toEqual([blocks[0], blocks[1]]);
    expect(kv.canAllocate(hit, 6)).toBe(true); // 8 free − 2 reclaimed ≥ 6
    expect(kv.canAllocate(hit, 7)).toBe(false);
    kv.touch(hit);
    kv.touch(hit); // a second sequence sharing the prefix
    expect(kv.refs(hit[0]!)).toBe(2);
    expect(kv.freeBlocks).toBe(6);
    kv.release(hit);
    expect(kv.freeBlocks).toBe(6);
    kv.release(hit);
    expect(kv.freeBlocks).toBe(8);
  });

  it("evicts the least recently freed blocks first, a sequence's tail before its head", () => {
    const kv = new KvCache(4, 1);
    const a = kv.allocate(2)!; // a0 a1
    kv.commit(a[0]!, 100);
    kv.commit(a[1]!, 101);
    const b = kv.allocate(2)!;
    kv.commit(b[0]!, 200);
    kv.commit(b[1]!, 201);
    kv.release(a); // queue: a1 a0
    kv.release(b); // queue: a1 a0 b1 b0
    const one = kv.allocate(1)!;
    expect(one).toEqual([a[1]]);
    expect(kv.isCached(101)).toBe(false);
    expect(kv.isCached(100)).toBe(true);
    expect(kv.evictions).toBe(1);
    // Taking a0 back from cache protects it; the next victim is b1.
    kv.touch(kv.lookup([100]));
    expect(kv.allocate(1)).toEqual([b[1]]);
    expect(kv.isCached(200)).toBe(true);
    expect(kv.isCached(201)).toBe(false);
  });

  it("keeps nothing when prefix caching is off", () => {
    const kv = new KvCache(2, 1, false);
    const a = kv.allocate(1)!;
    kv.commit(a[0]!, 7);
    kv.release(a);
    expect(kv.lookup([7])).toEqual([]);
  });
});
