/**
 * Each isolate's view of the RevocationLog (revocations.ts): the set of
 * revoked key ids, brought up to date at most every POLL_MS by asking the
 * log for what came after the last epoch seen. Pure; the fetch is injected.
 */
export const POLL_MS = 2_000;

export class RevocationWatch {
  private epoch = 0;
  private checkedAt = Number.NEGATIVE_INFINITY;
  private readonly revoked = new Set<string>();
  private polling = false;

  constructor(private readonly now: () => number = Date.now) {}

  /**
   * The view is older than POLL_MS and nobody is refreshing it. One poll at
   * a time: concurrent requests use the current view instead of all calling
   * the log when the interval runs out together.
   */
  due(): boolean {
    return !this.polling && this.now() - this.checkedAt >= POLL_MS;
  }

  /** Brings the view up to date if it is due (one call per isolate per interval). */
  async refresh(fetchSince: (epoch: number) => Promise<{ epoch: number; ids: string[] }>): Promise<void> {
    if (!this.due()) return;
    this.polling = true;
    try {
      const r = await fetchSince(this.epoch);
      for (const id of r.ids) this.revoked.add(id);
      this.epoch = r.epoch;
      this.checkedAt = this.now();
    } finally {
      this.polling = false;
    }
  }

  /** The log has answered this isolate at least once: before that it knows of no revocation. */
  get loaded(): boolean {
    return this.checkedAt > Number.NEGATIVE_INFINITY;
  }

  /** Known at once in the isolate that handled the RevokeKey call. */
  add(keyId: string): void {
    this.revoked.add(keyId);
  }

  isRevoked(keyId: string): boolean {
    return this.revoked.has(keyId);
  }
}

export const revocationWatch = new RevocationWatch();
