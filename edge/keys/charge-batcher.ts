/**
 * Charges from one isolate, grouped per key and sent to that key's ledger
 * in one call per `maxDelayMs` instead of one call per request: a busy
 * key's Durable Object then does one small transaction per batch, not one
 * per request, and the isolate serving requests makes one RPC. Each request
 * still waits (in waitUntil) for the batch that holds its own charge, so
 * nothing is acknowledged before it is stored; every batch has an id the
 * ledger is idempotent by, so a retried batch charges nothing twice. Pure
 * apart from setTimeout.
 */
export class ChargeBatcher<T> {
  private readonly pending = new Map<string, { items: T[]; done: Promise<void> }>();

  constructor(
    private readonly flush: (key: string, items: T[], batchId: string) => Promise<void>,
    private readonly maxDelayMs = 10,
    private readonly maxItems = 200,
    private readonly newId: () => string = () => crypto.randomUUID(),
  ) {}

  /** Resolves once the batch with this item is stored (rejects if it could not be, after one retry). */
  add(key: string, item: T): Promise<void> {
    const open = this.pending.get(key);
    if (open && open.items.length < this.maxItems) {
      open.items.push(item);
      return open.done;
    }
    const items = [item];
    const id = this.newId();
    const done = new Promise<void>((resolve, reject) => {
      setTimeout(() => {
        if (this.pending.get(key)?.items === items) this.pending.delete(key);
        this.flush(key, items, id)
          .catch(() => this.flush(key, items, id))
          .then(resolve, reject);
      }, this.maxDelayMs);
    });
    this.pending.set(key, { items, done });
    return done;
  }
}
