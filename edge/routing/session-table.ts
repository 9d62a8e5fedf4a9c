/**
 * Session affinity: the endpoint each session id was last routed to, so a
 * conversation's next turn finds its KV cache. Bounded both ways: an entry
 * idle for `idleMs` is forgotten, and past `capacity` entries the least
 * recently used goes (session ids come from clients; a flood of fresh ids
 * must not grow the pool's memory).
 */
export class SessionTable {
  private readonly pins = new Map<string, { endpoint: string; at: number }>();

  constructor(
    private readonly capacity = 100_000,
    private readonly idleMs = 30 * 60_000,
  ) {}

  get(session: string, now: number): string | undefined {
    const p = this.pins.get(session);
    if (!p) return undefined;
    if (now - p.at > this.idleMs) {
      this.pins.delete(session);
      return undefined;
    }
    return p.endpoint;
  }

  pin(session: string, endpoint: string, now: number): void {
    this.pins.delete(session);
    this.pins.set(session, { endpoint, at: now });
    if (this.pins.size > this.capacity) this.pins.delete(this.pins.keys().next().value as string);
  }

  /** Sessions of an endpoint that left the set go back to being unpinned. */
  forget(endpoint: string): void {
    for (const [s, p] of this.pins) if (p.endpoint === endpoint) this.pins.delete(s);
  }

  get size(): number {
    return this.pins.size;
  }
}
