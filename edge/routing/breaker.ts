/**
 * A circuit breaker per endpoint. `threshold` consecutive failures open it
 * for `cooldownMs`; then one request is let through as a probe (half-open):
 * success closes the breaker, failure opens it for another cooldown. Only
 * one probe at a time, so a dead engine costs one failed attempt per
 * cooldown rather than a burst.
 *
 * Pure (clock injected). Each model's pool holds one set, so what one
 * request learns about a dead engine protects every isolate's next request.
 */
export type BreakerState = "closed" | "open" | "half-open";

interface Entry {
  failures: number;
  openUntil: number;
  probing: boolean;
  /** The last failure's reason: why the breaker is open, once it is. */
  reason: string;
}

export class Breakers {
  private readonly entries = new Map<string, Entry>();

  constructor(
    public threshold: number,
    public cooldownMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Changes limits in place (settings can differ per deployment), keeping state. */
  configure(threshold: number, cooldownMs: number): void {
    this.threshold = threshold;
    this.cooldownMs = cooldownMs;
  }

  state(id: string): BreakerState {
    const e = this.entries.get(id);
    if (!e || e.failures < this.threshold) return "closed";
    return this.now() < e.openUntil ? "open" : "half-open";
  }

  /** Whether a request may go to this endpoint now. */
  canTry(id: string): boolean {
    const s = this.state(id);
    if (s === "closed") return true;
    if (s === "open") return false;
    return !this.entries.get(id)!.probing;
  }

  /** Call when an attempt starts; a half-open endpoint's attempt becomes the probe. */
  onAttempt(id: string): void {
    if (this.state(id) === "half-open") this.entries.get(id)!.probing = true;
  }

  onSuccess(id: string): void {
    this.entries.delete(id);
  }

  /** Counts a failure; true when it opens the breaker (the threshold reached, or a probe failed). */
  onFailure(id: string, reason = "failed"): boolean {
    const e = this.entries.get(id) ?? { failures: 0, openUntil: 0, probing: false, reason };
    e.failures++;
    e.probing = false;
    e.reason = reason;
    this.entries.set(id, e);
    if (e.failures < this.threshold) return false;
    e.openUntil = this.now() + this.cooldownMs;
    return true;
  }

  /** Why a breaker that is not closed opened: its last failure. */
  reason(id: string): string | null {
    const e = this.entries.get(id);
    return e && e.failures >= this.threshold ? e.reason : null;
  }

  /** Consecutive failures so far. */
  failures(id: string): number {
    return this.entries.get(id)?.failures ?? 0;
  }

  /** The probe ended without a verdict (e.g. the client left): let another probe through. */
  onAbandon(id: string): void {
    const e = this.entries.get(id);
    if (e) e.probing = false;
  }

  /** Half-open with its one probe out: not a candidate until the probe ends. */
  probing(id: string): boolean {
    return this.entries.get(id)?.probing === true && this.state(id) !== "closed";
  }

  forget(id: string): void {
    this.entries.delete(id);
  }
}
