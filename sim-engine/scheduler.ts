/**
 * Continuous batching after vLLM V1's scheduler, on a virtual clock.
 *
 * Every step has a token budget (`--max-num-batched-tokens`). Running
 * sequences are served first, oldest first: a decoding sequence takes one
 * token, a prefilling one takes as much of its remaining prompt as the budget
 * allows (chunked prefill). Then waiting sequences are admitted in FIFO order
 * while there is budget, a free slot (`--max-num-seqs`) and KV blocks for
 * them; a request whose prefix is cached only computes the uncached rest.
 * When a running sequence needs a block and none is free, the most recently
 * admitted running sequence is preempted (vLLM's recompute mode): its blocks
 * are released (they stay in the prefix cache until evicted) and it goes
 * back to the head of the queue. Full blocks enter the prefix cache when
 * they are scheduled, not when computed (V1's `allocate_slots` caches up to
 * the tokens it schedules), so a request admitted in the same step as an
 * identical prompt already hits it: the choices of an `n > 1` request
 * compute their prompt once.
 *
 * A sequence samples one token whenever a step leaves all of its tokens
 * computed. A pooling sequence (an embeddings request) is prefill only: the
 * step that computes its last prompt token finishes it ("stop") with a
 * `pooled` event and no output token, as vLLM's pooling runner does.
 * `plan()` decides a step, the caller advances its clock by the latency
 * model's price for `plan.shape`, then `complete()` applies it.
 * Pure: no timers, no I/O.
 */
import { KvCache } from "./kv-cache.ts";
import type { BatchShape } from "./latency-model.ts";

export type FinishReason = "stop" | "length" | "abort";

export interface SeqSpec {
  id: string;
  promptIds: readonly number[];
  /** Upper bound on output tokens (max_tokens, or what fits the context). */
  maxTokens: number;
  /** Where the model would stop by itself; Infinity with ignore_eos. */
  naturalLength: number;
  nextToken: (index: number) => number;
  /** Prefix-cache isolation (vLLM's `cache_salt`): different salts never share blocks. */
  cacheSalt?: number;
  /** Prefill only (embeddings): finishes when the prompt is computed, samples nothing. */
  pooling?: boolean;
  /** The choices of one `n > 1` request share one: its prompt is counted once (engine-core.ts). */
  group?: SeqGroup;
  arrival: number;
}

export interface SeqGroup {
  promptCounted: boolean;
}

export interface Seq {
  readonly spec: SeqSpec;
  /** Prompt then output token ids. */
  readonly tokens: number[];
  readonly promptLen: number;
  outputLen: number;
  computed: number;
  blocks: number[];
  /** Chained hashes of the full blocks of `tokens`, computed as they fill. */
  readonly hashes: number[];
  /** How many of `blocks` have been committed to the prefix cache. */
  committed: number;
  /** Prompt tokens served from the prefix cache at first admission. */
  cachedPromptTokens: number;
  state: "waiting" | "running" | "finished";
  aborted: boolean;
  preemptions: number;
  firstTokenAt?: number;
  lastTokenAt?: number;
  finishReason?: FinishReason;
}

export interface PlannedSeq {
  seq: Seq;
  tokens: number;
}

export interface StepPlan {
  items: PlannedSeq[];
  shape: BatchShape;
  preempted: number;
}

export type SeqEvent =
  | {
      kind: "token";
      seq: Seq;
      token: number;
      index: number;
      at: number;
      /** When this sequence's previous token came out (undefined for the first). */
      prevAt?: number;
      finished?: FinishReason;
    }
  /** A pooling sequence's prompt is computed: it is finished ("stop"), with no output token. */
  | { kind: "pooled"; seq: Seq; at: number; finished: "stop" }
  | { kind: "aborted"; seq: Seq; at: number };

export interface SchedulerConfig {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
}

export interface PrefixStats {
  queries: number;
  hits: number;
}

export class Scheduler {
  readonly kv: KvCache;
  readonly cfg: SchedulerConfig;
  private readonly waiting: Seq[] = [];
  private readonly running: Seq[] = [];
  private readonly byId = new Map<string, Seq>();
  private inStep = false;
  private abortsInStep = 0;
  readonly prefix: PrefixStats = { queries: 0, hits: 0 };
  preemptions = 0;

  constructor(cfg: SchedulerConfig, kv: KvCache) {
    if (cfg.maxNumSeqs < 1 || cfg.maxNumBatchedTokens < 1) throw new Error("invalid scheduler limits");
    this.cfg = cfg;
    this.kv = kv;
  }

  get numWaiting(): number {
    return this.waiting.length;
  }

  get numRunning(): number {
    return this.running.length;
  }

  hasWork(): boolean {
    return this.waiting.length > 0 || this.running.length > 0;
  }

  add(spec: SeqSpec): Seq {
    if (this.byId.has(spec.id)) throw new Error(`duplicate sequence id ${spec.id}`);
    const seq: Seq = {
      spec,
      tokens: [...spec.promptIds],
      promptLen: spec.promptIds.length,
      outputLen: 0,
      computed: 0,
      blocks: [],
      hashes: [],
      committed: 0,
      cachedPromptTokens: 0,
      state: "waiting",
      aborted: false,
      preemptions: 0,
    };
    this.byId.set(spec.id, seq);
    this.waiting.push(seq);
    return seq;
  }

  /**
   * Stops a sequence (client gone, stop string). Outside a step it leaves at
   * once; during a step it leaves when the step completes, and the token that
   * step would have given it is discarded, never counted.
   */
  abort(id: string, reason: FinishReason = "abort"): Seq | undefined {
    const seq = this.byId.get(id);
    if (!seq || seq.state === "finished") return undefined;
    seq.aborted = true;
    if (this.inStep) this.abortsInStep++;
    else this.retire(seq, reason);
    return seq;
  }

  plan(): StepPlan | undefined {
    if (this.inStep) throw new Error("plan() called twice without complete()");
    let budget = this.cfg.maxNumBatchedTokens;
    const items: PlannedSeq[] = [];
    let preempted = 0;
    const bs = this.kv.blockSize;

    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const seq = this.running[i]!;
      const want = Math.min(seq.tokens.length - seq.computed, budget);
      if (want <= 0) continue;
      const need = Math.ceil((seq.computed + want) / bs) - seq.blocks.length;
      let ok = true;
      while (need > 0 && this.kv.freeBlocks < need) {
        const victim = this.running[this.running.length - 1]!;
        this.preempt(victim);
        preempted++;
        if (victim === seq) {
          ok = false;
          break;
        }
      }
      if (!ok) break;
      if (need > 0) seq.blocks.push(...this.kv.allocate(need)!);
      this.commitFullBlocks(seq, seq.computed + want);
      items.push({ seq, tokens: want });
      budget -= want;
    }

    // Like vLLM, nothing new is admitted in a step that had to preempt.
    while (
      preempted === 0 &&
      budget > 0 &&
      this.waiting.length > 0 &&
      this.running.length < this.cfg.maxNumSeqs
    ) {
      const seq = this.waiting[0]!;
      const fresh = seq.computed === 0 && seq.blocks.length === 0;
      let hit: number[] = [];
      if (fresh) {
        // Cache hits are whole blocks within tokens[0 .. n-1): the last token is always computed.
        this.extendHashes(seq, seq.tokens.length - 1);
        hit = this.kv.lookup(seq.hashes.slice(0, Math.floor((seq.tokens.length - 1) / bs)));
      }
      const computed = hit.length * bs;
      const want = Math.min(seq.tokens.length - computed, budget);
      const need = Math.ceil((computed + want) / bs) - hit.length;
      if (!this.kv.canAllocate(hit, need)) break;
      this.kv.touch(hit);
      seq.blocks = [...hit, ...this.kv.allocate(need)!];
      seq.committed = hit.length;
      seq.computed = computed;
      if (seq.preemptions === 0) {
        this.prefix.queries += seq.promptLen;
        this.prefix.hits += Math.min(computed, seq.promptLen);
        seq.cachedPromptTokens = Math.min(computed, seq.promptLen);
      }
      this.waiting.shift();
      seq.state = "running";
      this.running.push(seq);
      this.commitFullBlocks(seq, computed + want);
      items.push({ seq, tokens: want });
      budget -= want;
    }

    if (items.length === 0) return undefined;
    let tokens = 0;
    let contextTokens = 0;
    for (const it of items) {
      tokens += it.tokens;
      contextTokens += it.seq.computed + it.tokens;
    }
    this.inStep = true;
    return { items, shape: { sequences: items.length, tokens, contextTokens }, preempted };
  }

  complete(plan: StepPlan, now: number): SeqEvent[] {
    if (!this.inStep) throw new Error("complete() without plan()");
    this.inStep = false;
    const events: SeqEvent[] = [];
    for (const { seq, tokens } of plan.items) {
      if (seq.state !== "running") continue; // preempted later in the same plan
      if (seq.aborted) {
        this.retire(seq, "abort");
        events.push({ kind: "aborted", seq, at: now });
        continue;
      }
      seq.computed += tokens;
      if (seq.computed < seq.tokens.length) continue; // prefill chunk, more to come
      if (seq.spec.pooling) {
        seq.firstTokenAt ??= now;
        this.retire(seq, "stop");
        events.push({ kind: "pooled", seq, at: now, finished: "stop" });
        continue;
      }
      const index = seq.outputLen;
      const token = seq.spec.nextToken(index);
      seq.tokens.push(token);
      seq.outputLen++;
      const prevAt = seq.lastTokenAt;
      seq.firstTokenAt ??= now;
      seq.lastTokenAt = now;
      let finished: FinishReason | undefined;
      if (seq.outputLen >= seq.spec.naturalLength) finished = "stop";
      else if (seq.outputLen >= seq.spec.maxTokens) finished = "length";
      if (finished) this.retire(seq, finished);
      const ev: SeqEvent = { kind: "token", seq, token, index, at: now };
      if (prevAt !== undefined) ev.prevAt = prevAt;
      if (finished) ev.finished = finished;
      events.push(ev);
    }
    // Aborts that arrived during the step for sequences not in it.
    if (this.abortsInStep === 0) return events;
    this.abortsInStep = 0;
    for (const seq of [...this.running, ...this.waiting]) {
      if (!seq.aborted) continue;
      this.retire(seq, "abort");
      events.push({ kind: "aborted", seq, at: now });
    }
    return events;
  }

  private preempt(seq: Seq): void {
    const i = this.running.lastIndexOf(seq);
    if (i >= 0) this.running.splice(i, 1);
    this.kv.release(seq.blocks);
    seq.blocks = [];
    seq.committed = 0;
    seq.computed = 0;
    seq.preemptions++;
    seq.state = "waiting";
    this.preemptions++;
    this.waiting.unshift(seq);
  }

  private retire(seq: Seq, reason: FinishReason): void {
    if (seq.state === "finished") return;
    if (seq.state === "running") {
      const i = this.running.indexOf(seq);
      if (i >= 0) this.running.splice(i, 1);
    } else {
      const i = this.waiting.indexOf(seq);
      if (i >= 0) this.waiting.splice(i, 1);
    }
    if (seq.blocks.length > 0) this.kv.release(seq.blocks);
    seq.blocks = [];
    seq.state = "finished";
    seq.finishReason = reason;
    this.byId.delete(seq.spec.id);
  }

  private extendHashes(seq: Seq, upTo: number): void {
    const bs = this.kv.blockSize;
    while ((seq.hashes.length + 1) * bs <= upTo) {
      const j = seq.hashes.length;
      const parent = j === 0 ? (seq.spec.cacheSalt ?? 0) : seq.hashes[j - 1]!;
      seq.hashes.push(KvCache.blockHash(parent, seq.tokens, j * bs, bs));
    }
  }

  /** Enters the full blocks of `tokens[0 .. upTo)` into the prefix cache. */
  private commitFullBlocks(seq: Seq, upTo: number): void {
    if (!this.kv.prefixCaching) return;
    const full = Math.floor(upTo / this.kv.blockSize);
    if (full <= seq.committed) return;
    this.extendHashes(seq, full * this.kv.blockSize);
    for (let j = seq.committed; j < full; j++) this.kv.commit(seq.blocks[j]!, seq.hashes[j]!);
    seq.committed = full;
  }
}
