/**
 * Which endpoint has probably cached which prompt blocks, recorded when a
 * request is routed there (the engine confirms nothing; this is the
 * anchors' approximate prefix index).
 *
 * Hashes are chained: holding block i of a prompt means having been sent
 * blocks 0..i with it. So an endpoint need not keep every block, only
 * checkpoints — the first 16 blocks, then blocks 16, 24, 32, 48, 64, … (two
 * per doubling) and the prompt's last — and a lookup binary-searches them:
 * the match is exact up to the spacing of the checkpoints, at about a tenth
 * of the memory and time of keeping every block of every prompt. Each
 * checkpoint counts for the blocks it stands for, so `capacity` is still in
 * blocks, as the engine's cache is.
 *
 * Recency is two generations per endpoint: a touched checkpoint goes to the
 * young one; when that holds half the capacity, the old one is dropped
 * whole and the young becomes old. What is touched often (a group's system
 * prompt) stays, and a touch or an eviction costs O(1).
 */

export interface MatchLevel {
  /** Leading blocks all of `endpoints` hold. */
  blocks: number;
  endpoints: string[];
}

interface Generations {
  young: Map<number, number>;
  old: Map<number, number>;
  youngBlocks: number;
  oldBlocks: number;
}

/** Indices of the checkpoint blocks of an n-block prompt, ascending. */
export function checkpoints(n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < Math.min(n, 16); i++) out.push(i);
  for (let p = 16; p < n; p *= 2) {
    out.push(p);
    if (p + p / 2 < n) out.push(p + p / 2);
  }
  if (n > 16 && out.at(-1) !== n - 1) out.push(n - 1);
  return out;
}

const CHECKPOINTS = new Map<number, number[]>();
function checkpointsOf(n: number): number[] {
  let c = CHECKPOINTS.get(n);
  if (!c) {
    c = checkpoints(n);
    CHECKPOINTS.set(n, c);
  }
  return c;
}

export class PrefixIndex {
  private readonly held = new Map<string, Generations>();

  constructor(private capacity: number) {}

  setCapacity(blocksPerEndpoint: number): void {
    this.capacity = blocksPerEndpoint;
    for (const g of this.held.values()) {
      while (g.youngBlocks + g.oldBlocks > this.capacity && g.youngBlocks + g.oldBlocks > 0) this.rotate(g);
    }
  }

  record(endpoint: string, hashes: readonly number[]): void {
    if (this.capacity === 0 || hashes.length === 0) return;
    let g = this.held.get(endpoint);
    if (!g) {
      g = { young: new Map(), old: new Map(), youngBlocks: 0, oldBlocks: 0 };
      this.held.set(endpoint, g);
    }
    let prev = -1;
    for (const i of checkpointsOf(hashes.length)) {
      const h = hashes[i]!;
      const stands = i - prev;
      prev = i;
      if (g.young.has(h)) continue;
      const was = g.old.get(h);
      if (was !== undefined) {
        g.old.delete(h);
        g.oldBlocks -= was;
      }
      g.young.set(h, stands);
      g.youngBlocks += stands;
      if (g.youngBlocks >= this.capacity / 2) this.rotate(g);
    }
  }

  /** Drops the old generation; the young one becomes old. */
  private rotate(g: Generations): void {
    g.old = g.young;
    g.oldBlocks = g.youngBlocks;
    g.young = new Map();
    g.youngBlocks = 0;
  }

  private holds(g: Generations, h: number): boolean {
    return g.young.has(h) || g.old.has(h);
  }

  /**
   * The eligible endpoints holding a leading run of `hashes`, longest run
   * first: each level lists everyone holding at least that many blocks.
   */
  match(hashes: readonly number[], eligible: (endpoint: string) => boolean): MatchLevel[] {
    if (hashes.length === 0) return [];
    const cps = checkpointsOf(hashes.length);
    const runs: [string, number][] = [];
    for (const [id, g] of this.held) {
      if (!this.holds(g, hashes[0]!) || !eligible(id)) continue;
      runs.push([id, this.run(g, hashes, cps)]);
    }
    runs.sort((a, b) => b[1] - a[1]);
    const levels: MatchLevel[] = [];
    for (let i = 0; i < runs.length; i++) {
      const blocks = runs[i]![1];
      if (i + 1 < runs.length && runs[i + 1]![1] === blocks) continue;
      levels.push({ blocks, endpoints: runs.slice(0, i + 1).map((r) => r[0]) });
    }
    return levels;
  }

  /** Blocks of the leading run of `hashes` one endpoint is taken to hold: what `match` finds for it alone. */
  heldRun(endpoint: string, hashes: readonly number[]): number {
    const g = this.held.get(endpoint);
    if (!g || hashes.length === 0 || !this.holds(g, hashes[0]!)) return 0;
    return this.run(g, hashes, checkpointsOf(hashes.length));
  }

  /** The blocks up to the last checkpoint held, given the first block is. */
  private run(g: Generations, hashes: readonly number[], cps: readonly number[]): number {
    let lo = 0;
    let hi = cps.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.holds(g, hashes[cps[mid]!]!)) lo = mid;
      else hi = mid - 1;
    }
    return cps[lo]! + 1;
  }

  forget(endpoint: string): void {
    this.held.delete(endpoint);
  }

  /** Blocks the endpoint is taken to hold (what its checkpoints stand for). */
  blocksHeld(endpoint: string): number {
    const g = this.held.get(endpoint);
    return g ? g.youngBlocks + g.oldBlocks : 0;
  }
}
