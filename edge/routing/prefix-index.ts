/**
 * Which endpoint has probably cached which prompt blocks: a per-endpoint
 * LRU of block hashes, recorded when a request is routed (not when the
 * engine confirms anything — it never does), plus a reverse map from a hash
 * to the endpoints holding it so a lookup costs the length of the match,
 * not the number of endpoints.
 *
 * A request's blocks are recorded tail first, so its beginning is the most
 * recently used part: under eviction a shared beginning (the system prompt)
 * outlives the tails, as in the engine's own prefix cache.
 */

export interface MatchLevel {
  /** Leading blocks all of `endpoints` hold. */
  blocks: number;
  endpoints: string[];
}

export class PrefixIndex {
  private readonly lru = new Map<string, Map<number, true>>();
  private readonly holders = new Map<number, Set<string>>();

  constructor(private capacity: number) {}

  setCapacity(blocksPerEndpoint: number): void {
    this.capacity = blocksPerEndpoint;
    for (const [id, lru] of this.lru) this.evict(id, lru);
  }

  record(endpoint: string, hashes: readonly number[]): void {
    if (this.capacity === 0 || hashes.length === 0) return;
    let lru = this.lru.get(endpoint);
    if (!lru) {
      lru = new Map();
      this.lru.set(endpoint, lru);
    }
    for (let i = hashes.length - 1; i >= 0; i--) {
      const h = hashes[i]!;
      if (lru.delete(h)) {
        lru.set(h, true);
        continue;
      }
      lru.set(h, true);
      let set = this.holders.get(h);
      if (!set) {
        set = new Set();
        this.holders.set(h, set);
      }
      set.add(endpoint);
    }
    this.evict(endpoint, lru);
  }

  private evict(endpoint: string, lru: Map<number, true>): void {
    while (lru.size > this.capacity) {
      const h = lru.keys().next().value as number;
      lru.delete(h);
      const set = this.holders.get(h);
      set?.delete(endpoint);
      if (set?.size === 0) this.holders.delete(h);
    }
  }

  /**
   * The eligible endpoints holding a leading run of `hashes`, longest run
   * first: each level lists everyone holding at least that many blocks.
   */
  match(hashes: readonly number[], eligible: (endpoint: string) => boolean): MatchLevel[] {
    const first = hashes.length > 0 ? this.holders.get(hashes[0]!) : undefined;
    if (!first) return [];
    let current: string[] = [];
    for (const id of first) if (eligible(id)) current.push(id);
    if (current.length === 0) return [];
    const levels: MatchLevel[] = [];
    let i = 1;
    for (; i < hashes.length; i++) {
      const set = this.holders.get(hashes[i]!);
      if (!set) break;
      const next = current.filter((id) => set.has(id));
      if (next.length === 0) break;
      if (next.length < current.length) levels.push({ blocks: i, endpoints: current });
      current = next;
    }
    levels.push({ blocks: i, endpoints: current });
    return levels.reverse();
  }

  forget(endpoint: string): void {
    const lru = this.lru.get(endpoint);
    if (!lru) return;
    for (const h of lru.keys()) {
      const set = this.holders.get(h);
      set?.delete(endpoint);
      if (set?.size === 0) this.holders.delete(h);
    }
    this.lru.delete(endpoint);
  }

  blocksHeld(endpoint: string): number {
    return this.lru.get(endpoint)?.size ?? 0;
  }
}
