/**
 * Charges from one isolate, grouped per key and sent to that key's ledger
 * in one call per `maxDelayMs` instead of one call per request: a busy
 * key's Durable Object then does one small transaction per batch, not one
 * per request, and the isolate serving requests makes one RPC. Each request
 * still waits (in waitUntil) for the batch that holds its own charge, so
 * nothing is acknowledged before it is stored; every batch has an id the
 * ledger is idempotent by, so a retried batch charges nothing twice. Pure
 * apart from setTimeout.
 *
 * Each request waits on a promise of its own, settled by the request whose
 * timer sends the batch, and holds a timer of its own while it waits
 * (docs/edge.md, "Promises belong to their request").
 */
/** How long a batch's two tries may take once sent; the runtime allows waitUntil work 30 s. */
const STORE_WITHIN_MS = 25_000;

interface Batch<T> {
  items: T[];
  /** Each item's own settle: its caller waits on a promise it made itself. */
  waiting: { resolve: () => void; reject: (err: unknown) => void }[];
}

export class ChargeBatcher<T> {
  private readonly pending = new Map<string, Batch<T>>();

  constructor(
    private readonly flush: (key: string, items: T[], batchId: string) => Promise<void>,
    private readonly maxDelayMs = 10,
    private readonly maxItems = 200,
    private readonly newId: () => string = () => crypto.randomUUID(),
  ) {}

  /** Resolves once the batch with this item is stored (rejects if it could not be, after one retry). */
  add(key: string, item: T): Promise<void> {
    return new Promise<void>((settled, failed) => {
      // A timer of the caller's own: a Workers request whose only pending
      // work is another request's promise is cancelled as hung, and with it
      // whatever followed its charge.
      const guard = setTimeout(
        () => failed(new Error(`charge batch not stored within ${this.maxDelayMs + STORE_WITHIN_MS} ms`)),
        this.maxDelayMs + STORE_WITHIN_MS,
      );
      const resolve = () => {
        clearTimeout(guard);
        settled();
      };
      const reject = (err: unknown) => {
        clearTimeout(guard);
        failed(err);
      };
      const open = this.pending.get(key);
      if (open && open.items.length < this.maxItems) {
        open.items.push(item);
        open.waiting.push({ resolve, reject });
        return;
      }
      const batch: Batch<T> = { items: [item], waiting: [{ resolve, reject }] };
      const id = this.newId();
      this.pending.set(key, batch);
      setTimeout(() => {
        if (this.pending.get(key) === batch) this.pending.delete(key);
        this.flush(key, batch.items, id)
          .catch(() => this.flush(key, batch.items, id))
          .then(
            () => {
              for (const w of batch.waiting) w.resolve();
            },
            (err) => {
              for (const w of batch.waiting) w.reject(err);
            },
          );
      }, this.maxDelayMs);
    });
  }
}
