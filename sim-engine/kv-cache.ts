/**
 * A paged KV cache with automatic prefix caching, after vLLM V1's block pool:
 *
 * - memory is `numBlocks` blocks of `blockSize` tokens; a running sequence
 *   holds ceil(computed tokens / blockSize) of them;
 * - a block that is full gets a hash chained on its parent's
 *   (h_i = H(h_{i-1}, tokens of block i)), so one hash names a whole prefix
 *   and a lookup walks the chain until the first miss;
 * - a block nobody references goes to the free queue but keeps its hash,
 *   so a later request with the same prefix can take it back (a hit);
 *   allocation pops the free queue's head and only then forgets the hash
 *   (eviction). A finished sequence's blocks are queued tail first, so the
 *   end of a prompt is evicted before its shared beginning.
 *
 * Pure data structure: no clock, no I/O.
 */
import { mix32 } from "../common/rng.ts";

const NONE = -1;

export class KvCache {
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly prefixCaching: boolean;
  private readonly refCount: Int32Array;
  private readonly hashOf: Float64Array;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private head = NONE;
  private tail = NONE;
  private free = 0;
  private readonly byHash = new Map<number, number>();
  /** Blocks whose cached content was thrown away to make room. */
  evictions = 0;

  constructor(numBlocks: number, blockSize: number, prefixCaching = true) {
    if (!Number.isInteger(numBlocks) || numBlocks < 1)
      throw new Error("numBlocks must be a positive integer");
    if (!Number.isInteger(blockSize) || blockSize < 1)
      throw new Error("blockSize must be a positive integer");
    this.numBlocks = numBlocks;
    this.blockSize = blockSize;
    this.prefixCaching = prefixCaching;
    this.refCount = new Int32Array(numBlocks);
    this.hashOf = new Float64Array(numBlocks).fill(Number.NaN);
    this.prev = new Int32Array(numBlocks).fill(NONE);
    this.next = new Int32Array(numBlocks).fill(NONE);
    for (let b = 0; b < numBlocks; b++) this.pushTail(b);
  }

  /** Blocks that can be handed out now: never used, or cached but unreferenced. */
  get freeBlocks(): number {
    return this.free;
  }

  /** vLLM's `kv_cache_usage_perc`: the share of blocks some running sequence holds. */
  usage(): number {
    return 1 - this.free / this.numBlocks;
  }

  cachedBlockCount(): number {
    return this.byHash.size;
  }

  /** Hash of block `index` of a token sequence, chained on the previous block's hash. */
  static blockHash(parent: number, tokens: readonly number[], start: number, blockSize: number): number {
    let h1 = mix32(parent, 0x2545f491);
    let h2 = mix32(parent, 0x68e31da4);
    for (let i = start; i < start + blockSize; i++) {
      const t = tokens[i]!;
      h1 = mix32(h1, t);
      h2 = mix32(h2 ^ 0x5bd1e995, t);
    }
    // 53 bits keep collisions negligible at millions of blocks and stay a plain number key.
    return h1 * 0x200000 + (h2 & 0x1fffff);
  }

  /** The cached blocks matching the longest prefix of `hashes` (not yet referenced by the caller). */
  lookup(hashes: readonly number[]): number[] {
    const hit: number[] = [];
    if (!this.prefixCaching) return hit;
    for (const h of hashes) {
      const b = this.byHash.get(h);
      if (b === undefined) break;
      hit.push(b);
    }
    return hit;
  }

  /** Whether `cached` (from lookup) plus `fresh` new blocks can be held at once. */
  canAllocate(cached: readonly number[], fresh: number): boolean {
    let reclaimed = 0;
    for (const b of cached) if (this.refCount[b] === 0) reclaimed++;
    return this.free - reclaimed >= fresh;
  }

  /** Takes a reference on cached blocks (removing them from the free queue if idle). */
  touch(blocks: readonly number[]): void {
    for (const b of blocks) {
      if (this.refCount[b] === 0) this.unlink(b);
      this.refCount[b]!++;
    }
  }

  /** Hands out `n` blocks from the free queue's head, evicting their cached content. */
  allocate(n: number): number[] | undefined {
    if (n > this.free) return undefined;
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      const b = this.head;
      this.unlink(b);
      const h = this.hashOf[b]!;
      if (!Number.isNaN(h)) {
        if (this.byHash.get(h) === b) this.byHash.delete(h);
        this.hashOf[b] = Number.NaN;
        this.evictions++;
      }
      this.refCount[b] = 1;
      out.push(b);
    }
    return out;
  }

  /** Drops one reference on each block; idle ones join the free queue, last block first. */
  release(blocks: readonly number[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i]!;
      const rc = --this.refCount[b]!;
      if (rc < 0) throw new Error(`block ${b} released twice`);
      if (rc === 0) {
        // Without prefix caching a freed block has nothing worth keeping.
        if (!this.prefixCaching) this.forget(b);
        this.pushTail(b);
      }
    }
  }

  /** Records that `block` now holds the full block named `hash`. */
  commit(block: number, hash: number): void {
    if (!this.prefixCaching || !Number.isNaN(this.hashOf[block]!)) return;
    if (this.byHash.has(hash)) return; // an identical block is cached already; keep that one
    this.hashOf[block] = hash;
    this.byHash.set(hash, block);
  }

  isCached(hash: number): boolean {
    return this.byHash.has(hash);
  }

  refs(block: number): number {
    return this.refCount[block]!;
  }

  private forget(b: number): void {
    const h = this.hashOf[b]!;
    if (!Number.isNaN(h) && this.byHash.get(h) === b) this.byHash.delete(h);
    this.hashOf[b] = Number.NaN;
  }

  private pushTail(b: number): void {
    this.prev[b] = this.tail;
    this.next[b] = NONE;
    if (this.tail === NONE) this.head = b;
    else this.next[this.tail] = b;
    this.tail = b;
    this.free++;
  }

  private unlink(b: number): void {
    const p = this.prev[b]!;
    const n = this.next[b]!;
    if (p === NONE) this.head = n;
    else this.next[p] = n;
    if (n === NONE) this.tail = p;
    else this.prev[n] = p;
    this.prev[b] = NONE;
    this.next[b] = NONE;
    this.free--;
  }
}
