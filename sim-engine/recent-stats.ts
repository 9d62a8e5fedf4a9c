/**
 * What an engine core did lately, as SGLang's scheduler reports it in its
 * gauges (python/sglang/srt/managers/scheduler_metrics_mixin.py): the prefix
 * cache hit rate of the last prefill batch (`log_prefill_stats`), and the
 * generation throughput over the last `decode_log_interval` (40) decode
 * batches (`log_decode_stats`), which it keeps between two such logs, idle
 * time included. Pure; times are the core's simulated seconds.
 */

/** SGLang's --decode-log-interval default: its throughput gauge moves every 40 decode steps. */
export const DECODE_LOG_INTERVAL = 40;

export class RecentStats {
  /** Cached prompt tokens over looked-up prompt tokens, of the last step that admitted any. */
  lastPrefillHitRate = 0;
  /** Output tokens per simulated second over the last DECODE_LOG_INTERVAL steps that sampled. */
  genThroughput = 0;
  private queries = 0;
  private hits = 0;
  private decodeSteps = 0;
  private tokens = 0;
  private since = 0;

  /** After a step ending at `now`: the prefix cache's lifetime counters and the tokens the step produced. */
  record(now: number, queries: number, hits: number, produced: number): void {
    if (queries > this.queries) this.lastPrefillHitRate = (hits - this.hits) / (queries - this.queries);
    this.queries = queries;
    this.hits = hits;
    if (produced === 0) return;
    this.tokens += produced;
    if (++this.decodeSteps < DECODE_LOG_INTERVAL) return;
    this.genThroughput = now > this.since ? this.tokens / (now - this.since) : 0;
    this.since = now;
    this.tokens = 0;
    this.decodeSteps = 0;
  }
}
