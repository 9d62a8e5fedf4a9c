/**
 * One simulated engine core: the scheduler, the KV cache, the latency model
 * and the counters, joined on a clock the caller owns. The real-time driver
 * and the benchmark's virtual-clock predictor both run exactly this code, so
 * what the benchmark predicts is what the process does.
 *
 * Accounting rule (billing depends on it): a request's prompt tokens are
 * counted when its first token comes out, and every token counts when it
 * comes out of a step. A token a step produced for a request that was
 * aborted meanwhile is discarded and not counted, so the counters equal the
 * sum of the usage the engine reports (or would have reported) per request.
 * A pooling (embeddings) sequence counts its prompt tokens when its prefill
 * completes, and no generation tokens. The choices of an `n > 1` request
 * (one SeqGroup) count their shared prompt once, at the first token of any.
 */
import { KvCache } from "./kv-cache.ts";
import { H100_LLAMA_3_1_8B, type LatencyParams, stepSeconds } from "./latency-model.ts";
import { type EngineGauges, EngineMetrics } from "./metrics.ts";
import { RecentStats } from "./recent-stats.ts";
import {
  type FinishReason,
  Scheduler,
  type SchedulerConfig,
  type Seq,
  type SeqEvent,
  type SeqSpec,
  type StepPlan,
} from "./scheduler.ts";

export interface EngineCoreConfig extends SchedulerConfig {
  numBlocks: number;
  blockSize: number;
  prefixCaching: boolean;
  latency: LatencyParams;
}

/**
 * The engine `llmgw sim-engine serve` runs with its default flags: Llama 3.1
 * 8B on one H100 80 GB at 0.9 GPU memory utilisation (27,669 KV blocks of
 * 16), vLLM's default batch limits. Kept here so tests and benchmarks that
 * drive the core without a server simulate the same engine.
 */
export const DEFAULT_H100_8B_CORE: Readonly<EngineCoreConfig> = Object.freeze({
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  numBlocks: 27_669,
  blockSize: 16,
  prefixCaching: true,
  latency: H100_LLAMA_3_1_8B,
});

export interface Step {
  plan: StepPlan;
  seconds: number;
  /** Whether any sequence will sample a token at the end of this step. */
  samples: boolean;
}

export class EngineCore {
  readonly scheduler: Scheduler;
  readonly metrics = new EngineMetrics();
  /** The latest hit rate and throughput, for SGLang's gauges. */
  readonly recent = new RecentStats();
  readonly cfg: EngineCoreConfig;
  private current: Step | undefined;

  constructor(cfg: EngineCoreConfig) {
    this.cfg = cfg;
    this.scheduler = new Scheduler(cfg, new KvCache(cfg.numBlocks, cfg.blockSize, cfg.prefixCaching));
  }

  get busy(): boolean {
    return this.current !== undefined;
  }

  hasWork(): boolean {
    return this.scheduler.hasWork();
  }

  /** Requests queued or running: what a data-parallel front end balances on. */
  load(): number {
    return this.scheduler.numWaiting + this.scheduler.numRunning;
  }

  submit(spec: SeqSpec): Seq {
    return this.scheduler.add(spec);
  }

  startStep(): Step | undefined {
    if (this.current) throw new Error("a step is already in flight");
    const plan = this.scheduler.plan();
    if (!plan) return undefined;
    let samples = false;
    for (const it of plan.items) {
      if (!it.seq.spec.pooling && it.seq.computed + it.tokens >= it.seq.tokens.length) samples = true;
    }
    this.current = { plan, seconds: stepSeconds(this.cfg.latency, plan.shape), samples };
    return this.current;
  }

  finishStep(now: number): SeqEvent[] {
    const step = this.current;
    if (!step) throw new Error("no step in flight");
    this.current = undefined;
    const events = this.scheduler.complete(step.plan, now);
    const m = this.metrics;
    for (const ev of events) {
      const seq = ev.seq;
      if (ev.kind === "aborted") {
        m.success.abort++;
        continue;
      }
      if (ev.kind === "pooled") {
        // vLLM counts a pooling request's prompt and first-token latency when its
        // prefill is done, and it finishes as "stop"; it generates nothing.
        m.promptTokens += seq.promptLen;
        m.ttft.observe(Math.max(0, ev.at - seq.spec.arrival));
        this.countFinished(seq, "stop", ev.at);
        continue;
      }
      m.generationTokens++;
      if (ev.index === 0) {
        // Once per request: the usage of an n > 1 request counts its prompt once
        // (vLLM's counter counts it per choice; see docs/sim-engine.md).
        const group = seq.spec.group;
        if (!group?.promptCounted) m.promptTokens += seq.promptLen;
        if (group) group.promptCounted = true;
        m.ttft.observe(Math.max(0, ev.at - seq.spec.arrival));
      } else if (ev.prevAt !== undefined) {
        m.itl.observe(ev.at - ev.prevAt);
      }
      if (ev.finished) this.countFinished(seq, ev.finished, ev.at);
    }
    m.prefixQueries = this.scheduler.prefix.queries;
    m.prefixHits = this.scheduler.prefix.hits;
    m.preemptions = this.scheduler.preemptions;
    let produced = 0;
    for (const ev of events) if (ev.kind === "token") produced++;
    this.recent.record(now, m.prefixQueries, m.prefixHits, produced);
    return events;
  }

  /**
   * Ends a request from outside (stop string matched: "stop"; client gone:
   * "abort"). Returns false if it had already finished.
   */
  cancel(id: string, reason: FinishReason, now: number): boolean {
    const seq = this.scheduler.abort(id, reason);
    if (!seq) return false;
    // Inside a step the scheduler reports the abort when the step completes.
    if (seq.state === "finished") this.countFinished(seq, reason, now);
    return true;
  }

  gauges(): EngineGauges {
    return {
      waiting: this.scheduler.numWaiting,
      running: this.scheduler.numRunning,
      kvUsage: this.scheduler.kv.usage(),
      numBlocks: this.cfg.numBlocks,
      blockSize: this.cfg.blockSize,
    };
  }

  private countFinished(seq: Seq, reason: FinishReason, at: number): void {
    this.metrics.success[reason]++;
    if (reason !== "abort") this.metrics.e2e.observe(Math.max(0, at - seq.spec.arrival));
  }
}
