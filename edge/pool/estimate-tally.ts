/**
 * Usage this isolate estimated (the engine reported none, edge/proxy/usage-estimate.ts)
 * and has not yet told the model's pool. The pool is the one place that
 * counts per model across isolates (docs/metrics.md,
 * `llmgw_edge_estimated_*`), and the admit is the call an isolate already
 * makes to it, so the counts ride on the model's next admit from this
 * isolate, as fail-opens do. They trail by at most one request per isolate;
 * an isolate that is evicted first takes its last counts with it.
 */
import type { EstimatedUsage } from "../routing/pool-protocol.ts";

export class EstimateTally {
  private readonly pending = new Map<string, EstimatedUsage>();

  /** Counts to send: a request just charged an estimate, or an admit's that the pool never received. */
  add(model: string, e: EstimatedUsage | undefined): void {
    if (!e) return;
    const p = this.pending.get(model) ?? { requests: 0, tokens: 0 };
    p.requests += e.requests;
    p.tokens += e.tokens;
    this.pending.set(model, p);
  }

  /** What to send with the model's next admit; undefined when there is nothing. */
  take(model: string): EstimatedUsage | undefined {
    const p = this.pending.get(model);
    this.pending.delete(model);
    return p;
  }
}

/** This isolate's. */
export const estimateTally = new EstimateTally();
