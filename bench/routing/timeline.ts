/**
 * The discrete-event benches' clock (fleet, sites, day, pool isolates): a
 * small binary heap of timed callbacks; ties run in scheduling order.
 */
export class Timeline {
  private heap: { t: number; seq: number; run: () => void }[] = [];
  private seq = 0;
  now = 0;

  at(t: number, run: () => void): void {
    const h = this.heap;
    h.push({ t, seq: this.seq++, run });
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (before(h[p]!, h[i]!)) break;
      [h[p], h[i]] = [h[i]!, h[p]!];
      i = p;
    }
  }

  /** Runs everything due, in order; returns false when nothing is left. */
  step(): boolean {
    const h = this.heap;
    const top = h[0];
    if (!top) return false;
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && before(h[l]!, h[m]!)) m = l;
        if (r < h.length && before(h[r]!, h[m]!)) m = r;
        if (m === i) break;
        [h[m], h[i]] = [h[i]!, h[m]!];
        i = m;
      }
    }
    this.now = top.t;
    top.run();
    return true;
  }
}

function before(a: { t: number; seq: number }, b: { t: number; seq: number }): boolean {
  return a.t < b.t || (a.t === b.t && a.seq < b.seq);
}
