/**
 * Chooses the endpoint for one attempt. Deliberately simple and narrow
 * (`pick(candidates, exclude)`): the ModelPool issue replaces it with
 * band-aware flow control and load/affinity scoring behind the same call.
 *
 * Policy: only the best priority tier with an eligible endpoint is
 * considered (lower `priority` number first; higher tiers spill over to
 * lower ones only when none is eligible). Within the tier, power of two
 * choices by weight, preferring the one with fewer requests in flight per
 * unit of weight — randomised because every isolate picks on its own.
 */
export interface Pickable {
  id: string;
  weight: number;
  priority: number;
}

export class Picker {
  private readonly inflight = new Map<string, number>();

  constructor(private readonly random: () => number = Math.random) {}

  pick<E extends Pickable>(candidates: readonly E[], exclude: ReadonlySet<string>): E | undefined {
    let best = Number.POSITIVE_INFINITY;
    for (const c of candidates) if (!exclude.has(c.id) && c.priority < best) best = c.priority;
    const tier = candidates.filter((c) => !exclude.has(c.id) && c.priority === best);
    if (tier.length === 0) return undefined;
    if (tier.length === 1) return tier[0];
    const a = this.weighted(tier);
    let b = this.weighted(tier);
    if (b === a) b = tier[(tier.indexOf(a) + 1) % tier.length]!;
    return this.load(a) <= this.load(b) ? a : b;
  }

  begin(id: string): void {
    this.inflight.set(id, (this.inflight.get(id) ?? 0) + 1);
  }

  end(id: string): void {
    const n = (this.inflight.get(id) ?? 1) - 1;
    if (n <= 0) this.inflight.delete(id);
    else this.inflight.set(id, n);
  }

  inFlight(id: string): number {
    return this.inflight.get(id) ?? 0;
  }

  private load(e: Pickable): number {
    return (this.inflight.get(e.id) ?? 0) / e.weight;
  }

  private weighted<E extends Pickable>(tier: readonly E[]): E {
    let total = 0;
    for (const e of tier) total += e.weight;
    let r = this.random() * total;
    for (const e of tier) {
      r -= e.weight;
      if (r < 0) return e;
    }
    return tier[tier.length - 1]!;
  }
}
