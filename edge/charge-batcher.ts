/**
 * Charges from one isolate, grouped per key and sent to that key's ledger
 * in one call every few milliseconds instead of one call per request: a
 * busy key's Durable Object then does one transaction per batch, not one
 * per request. Each request still waits (in waitUntil) for the batch that
 * holds its own charge, so nothing is acknowledged before it is stored; the
 * ledger is idempotent by request id, so a retried batch charges nothing
 * twice. Pure apart from setTimeout.
 */
export class ChargeBatcher<T> {
  private readonly pending = new Map<string, { items: T[]; done: Promise<void> }>();

  constructor(
    private readonly flush: (key: string, items: T[]) => Promise<void>,
    private readonly maxDelayMs = 10,
    private readonly maxItems = 200,
  ) {}

  /** Resolves once the batch with this item is stored (rejects if it could not be, after one retry). */
  add(key: string, item: T): Promise<void> {
    const open = this.pending.get(key);
    if (open && open.items.length < this.maxItems) {
      open.items.push(item);
      return open.done;
    }
    const items = [item];
    const done = new Promise<void>((resolve, reject) => {
      setTimeout(() => {
        if (this.pending.get(key)?.items === items) this.pending.delete(key);
        this.flush(key, items)
          .catch(() => this.flush(key, items))
          .then(resolve, reject);
      }, this.maxDelayMs);
    });
    this.pending.set(key, { items, done });
    return done;
  }
}
