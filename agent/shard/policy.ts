/**
 * The numbers a shard's lifecycle (lifecycle.ts) decides by: how often it
 * polls an engine, how long it waits for one, when it restarts one.
 */
export interface RestartPolicy {
  /** Agent-local restart of a failed single-node shard. Multi-node shards are a gang: the control plane restarts those. */
  enabled: boolean;
  baseMs: number;
  maxMs: number;
  /** Healthy this long and the failure count starts over. */
  resetAfterMs: number;
}

export const DEFAULT_RESTART: RestartPolicy = {
  enabled: true,
  baseMs: 10_000,
  maxMs: 5 * 60_000,
  resetAfterMs: 10 * 60_000,
};

export interface LifecyclePolicy {
  restart: RestartPolicy;
  /** Readiness poll while starting; also how long a headless rank must stay up to count as ready. */
  healthIntervalMs: number;
  /** Health poll once ready; `livenessFailures` misses in a row fail the shard. 0 failures disables it. */
  livenessIntervalMs: number;
  livenessFailures: number;
  defaultStartupDeadlineMs: number;
  defaultStopGraceMs: number;
  drainPollMs: number;
  /** Minimum time in draining, so the edge hears of it before an idle engine is stopped. */
  drainSettleMs: number;
}

export const DEFAULT_POLICY: LifecyclePolicy = {
  restart: DEFAULT_RESTART,
  healthIntervalMs: 1_000,
  livenessIntervalMs: 5_000,
  livenessFailures: 6,
  defaultStartupDeadlineMs: 20 * 60_000,
  defaultStopGraceMs: 30_000,
  drainPollMs: 1_000,
  drainSettleMs: 2_000,
};
