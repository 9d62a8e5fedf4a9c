/**
 * How many connections a listener holds at once, in total and per source
 * address (IPv6 per /64, as Enroll's limit counts them). Anyone who can
 * reach a listener can open connections; without a cap, idle ones cost the
 * control plane a socket and memory each until it runs out. A connection
 * over either cap is refused at once, before TLS or HTTP, and counted by
 * which cap it hit.
 */
export interface ConnectionLimits {
  total: number;
  perAddress: number;
}

export type Admission = { ok: true } | { ok: false; reason: "total" | "per_address" };

export class ConnectionBudget {
  private readonly bySource = new Map<string, number>();
  private open = 0;
  /** Refusals by the cap that was hit. */
  readonly refused = { total: 0, per_address: 0 };

  constructor(private readonly limits: ConnectionLimits) {}

  get connections(): number {
    return this.open;
  }

  /** Takes a place for a connection from `source`; `release` gives it back. */
  admit(source: string): Admission {
    if (this.open >= this.limits.total) return this.refuse("total");
    const held = this.bySource.get(source) ?? 0;
    if (held >= this.limits.perAddress) return this.refuse("per_address");
    this.bySource.set(source, held + 1);
    this.open++;
    return { ok: true };
  }

  release(source: string): void {
    const held = this.bySource.get(source) ?? 0;
    if (held <= 1) this.bySource.delete(source);
    else this.bySource.set(source, held - 1);
    if (held > 0) this.open--;
  }

  private refuse(reason: "total" | "per_address"): Admission {
    this.refused[reason]++;
    return { ok: false, reason };
  }
}
