/**
 * The last refused attempt to take each node name — an Enroll for a name
 * that holds a certificate, a stream with a certificate that is not the one
 * on record — so `ctl nodes` can say who tried, not only the log. In
 * memory: after a restart the log keeps the history.
 */
export interface ClaimRefusal {
  at: number;
  /** The refusal's reason, as counted in the metrics. */
  reason: string;
  /** The caller's source address. */
  from: string;
  /** The serial of the certificate it presented, if any. */
  serial?: string;
}

/** Names are the caller's choice, so the record is bounded: the oldest name goes first. */
const MAX_NAMES = 1_024;

export class ClaimRefusals {
  private readonly byNode = new Map<string, ClaimRefusal>();

  note(node: string, refusal: ClaimRefusal): void {
    this.byNode.delete(node);
    this.byNode.set(node, refusal);
    if (this.byNode.size > MAX_NAMES) this.byNode.delete(this.byNode.keys().next().value as string);
  }

  latest(node: string): ClaimRefusal | undefined {
    return this.byNode.get(node);
  }
}
