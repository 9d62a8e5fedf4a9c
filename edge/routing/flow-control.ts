/**
 * The gateway-side queue (after the Inference Extension's flow controller,
 * docs/routing.md): one queue per priority band, each dispatching only while the
 * pool's saturation is below the band's ceiling.
 *
 * - Strict priority with head-of-line blocking: the highest band holding
 *   work decides. If it is over its ceiling nothing dispatches, not even a
 *   lower band whose ceiling the saturation happens to meet — lower bands
 *   must not take the capacity a higher band is waiting for.
 * - Fair across keys within a band: each key has its own FIFO and the band
 *   takes one request from each key in turn, so one key's burst does not
 *   push everyone else's requests to the back.
 * - Bounded: `capacity` waiters per band (then "full", a 429) and a TTL
 *   (then expired, a 503). A waiter whose client left is removed by id.
 *
 * Decisions only: the caller owns the clock and what dispatching means.
 */

export interface BandSpec {
  name: string;
  priority: number;
  ceiling: number;
}

export interface Waiter<T> {
  id: string;
  band: string;
  key: string;
  enqueuedAt: number;
  deadline: number;
  item: T;
}

export type Offer = "dispatch" | "queued" | "full";

class Fifo<T> {
  private items: T[] = [];
  private head = 0;
  get size(): number {
    return this.items.length - this.head;
  }
  push(v: T): void {
    this.items.push(v);
  }
  peek(): T | undefined {
    return this.items[this.head];
  }
  shift(): T | undefined {
    const v = this.items[this.head];
    if (v === undefined) return undefined;
    this.items[this.head++] = undefined as T;
    if (this.head > 32 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return v;
  }
  remove(pred: (v: T) => boolean): T | undefined {
    for (let i = this.head; i < this.items.length; i++) {
      const v = this.items[i]!;
      if (pred(v)) {
        this.items.splice(i, 1);
        return v;
      }
    }
    return undefined;
  }
}

class BandQueue<T> {
  /** Key → its FIFO; Map order is the round-robin ring (a served key moves to the back). */
  readonly byKey = new Map<string, Fifo<Waiter<T>>>();
  size = 0;
  constructor(public spec: BandSpec) {}

  push(w: Waiter<T>): void {
    let q = this.byKey.get(w.key);
    if (!q) {
      q = new Fifo();
      this.byKey.set(w.key, q);
    }
    q.push(w);
    this.size++;
  }

  /** The next key's oldest waiter. */
  shift(): Waiter<T> | undefined {
    for (const [key, q] of this.byKey) {
      const w = q.shift()!;
      this.byKey.delete(key);
      if (q.size > 0) this.byKey.set(key, q);
      this.size--;
      return w;
    }
    return undefined;
  }

  remove(id: string, key: string): Waiter<T> | undefined {
    const q = this.byKey.get(key);
    const w = q?.remove((x) => x.id === id);
    if (!w) return undefined;
    if (q!.size === 0) this.byKey.delete(key);
    this.size--;
    return w;
  }

  /** Waiters past their deadline, oldest first per key. */
  expire(now: number, out: Waiter<T>[]): void {
    for (const [key, q] of this.byKey) {
      while ((q.peek()?.deadline ?? Number.POSITIVE_INFINITY) <= now) {
        out.push(q.shift()!);
        this.size--;
      }
      if (q.size === 0) this.byKey.delete(key);
    }
  }

  earliestDeadline(): number {
    let d = Number.POSITIVE_INFINITY;
    for (const q of this.byKey.values()) d = Math.min(d, q.peek()?.deadline ?? d);
    return d;
  }
}

export interface FlowOptions {
  enabled: boolean;
  capacityPerBand: number;
  ttlMs: number;
}

export class FlowController<T> {
  /** Highest priority first. */
  private bands: BandQueue<T>[] = [];
  private readonly where = new Map<string, { band: BandQueue<T>; key: string }>();
  private opts: FlowOptions;

  constructor(bands: readonly BandSpec[], opts: FlowOptions) {
    this.opts = opts;
    this.bands = this.build(bands);
  }

  /**
   * New bands or limits. Waiters of a band that no longer exists are
   * returned for the caller to refuse; the others keep their place.
   */
  configure(bands: readonly BandSpec[], opts: FlowOptions): Waiter<T>[] {
    this.opts = opts;
    const old = new Map(this.bands.map((b) => [b.spec.name, b]));
    this.bands = this.build(bands, old);
    const orphans: Waiter<T>[] = [];
    for (const [name, q] of old) {
      if (this.bands.some((b) => b.spec.name === name)) continue;
      for (let w = q.shift(); w; w = q.shift()) {
        this.where.delete(w.id);
        orphans.push(w);
      }
    }
    return orphans;
  }

  private build(specs: readonly BandSpec[], reuse?: Map<string, BandQueue<T>>): BandQueue<T>[] {
    return [...specs]
      .sort((a, b) => b.priority - a.priority)
      .map((s) => {
        const q = reuse?.get(s.name);
        if (!q) return new BandQueue<T>(s);
        q.spec = s;
        return q;
      });
  }

  get ttlMs(): number {
    return this.opts.ttlMs;
  }

  /**
   * A new request: dispatch it now, queue it, or refuse it. It may go at
   * once only if nothing of its own or a higher band is waiting (FIFO within
   * a band, strict priority across) and the saturation is under its ceiling.
   */
  offer(w: Waiter<T>, saturation: number): Offer {
    if (!this.opts.enabled) return "dispatch";
    const band = this.bands.find((b) => b.spec.name === w.band);
    if (!band) throw new Error(`unknown band ${w.band}`);
    let blocked = false;
    for (const b of this.bands) {
      if (b.size > 0) blocked = true;
      if (b === band) break;
    }
    if (!blocked && saturation < band.spec.ceiling) return "dispatch";
    if (band.size >= this.opts.capacityPerBand) return "full";
    band.push(w);
    this.where.set(w.id, { band, key: w.key });
    return "queued";
  }

  /** The waiter to dispatch now, if the highest band holding work is under its ceiling. */
  next(saturation: number): Waiter<T> | undefined {
    for (const b of this.bands) {
      if (b.size === 0) continue;
      if (saturation >= b.spec.ceiling) return undefined;
      const w = b.shift()!;
      this.where.delete(w.id);
      return w;
    }
    return undefined;
  }

  /** A waiter whose client left. */
  remove(id: string): Waiter<T> | undefined {
    const at = this.where.get(id);
    if (!at) return undefined;
    this.where.delete(id);
    return at.band.remove(id, at.key);
  }

  expire(now: number): Waiter<T>[] {
    const out: Waiter<T>[] = [];
    for (const b of this.bands) b.expire(now, out);
    for (const w of out) this.where.delete(w.id);
    return out;
  }

  has(id: string): boolean {
    return this.where.has(id);
  }

  depth(band: string): number {
    return this.bands.find((b) => b.spec.name === band)?.size ?? 0;
  }

  get size(): number {
    return this.where.size;
  }

  nextDeadline(): number | undefined {
    let d = Number.POSITIVE_INFINITY;
    for (const b of this.bands) d = Math.min(d, b.earliestDeadline());
    return Number.isFinite(d) ? d : undefined;
  }
}
