import { describe, expect, it } from "vitest";
import { DEFAULT_H100_8B_CORE, EngineCore, type EngineCoreConfig } from "./engine-core.ts";
import { KvCache } from "./kv-cache.ts";
import { simulateClosedLoop } from "./predict.ts";
import { Scheduler, type SeqSpec } from "./scheduler.ts";

const spec = (id: string, prompt: number[], out: number, extra: Partial<SeqSpec> = {}): SeqSpec => ({
  id,
  promptIds: prompt,
  maxTokens: out,
  naturalLength: Number.POSITIVE_INFINITY,
  nextToken: (k) => 1_000_000 + k,
  arrival: 0,
  ...extra,
});
const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

/** Runs steps to completion; returns per-step plans' (id → tokens) for inspection. */
function drain(s: Scheduler, maxSteps = 10_000) {
  const steps: Record<string, number>[] = [];
  for (let t = 1; s.hasWork() && t < maxSteps; t++) {
    const plan = s.plan();
    if (!plan) break;
    steps.push(Object.fromEntries(plan.items.map((i) => [i.seq.spec.id, i.tokens])));
    s.complete(plan, t);
  }
  return steps;
}

describe("Scheduler", () => {
  it("batches decodes and caps the running set at max-num-seqs", () => {
    const s = new Scheduler({ maxNumSeqs: 2, maxNumBatchedTokens: 1000 }, new KvCache(100, 16));
    for (const id of ["a", "b", "c"]) s.add(spec(id, range(10), 3));
    const steps = drain(s);
    expect(steps[0]).toEqual({ a: 10, b: 10 }); // c waits for a slot
    expect(steps[1]).toEqual({ a: 1, b: 1 });
    expect(steps[2]).toEqual({ a: 1, b: 1 }); // a and b finish (3 tokens)
    expect(steps[3]).toEqual({ c: 10 });
    expect(steps).toHaveLength(6);
  });

  it("chunks a long prefill by max-num-batched-tokens and lets decodes go first", () => {
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 100 }, new KvCache(100, 16));
    s.add(spec("short", range(10), 5));
    const p1 = s.plan()!;
    s.complete(p1, 1);
    s.add(spec("long", range(250, 1000), 1));
    const steps = drain(s);
    expect(steps[0]).toEqual({ short: 1, long: 99 });
    expect(steps[1]).toEqual({ short: 1, long: 99 });
    expect(steps[2]).toEqual({ short: 1, long: 52 }); // long samples its only token here
  });

  it("computes only the uncached part of a prompt whose prefix is cached", () => {
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 1000 }, new KvCache(100, 16));
    const shared = range(64);
    s.add(spec("first", [...shared, 7, 8, 9], 1));
    drain(s);
    expect(s.prefix).toEqual({ queries: 67, hits: 0 });
    s.add(spec("second", [...shared, 4, 5], 1));
    const steps = drain(s);
    expect(steps[0]).toEqual({ second: 2 }); // 64 tokens = 4 blocks from cache
    expect(s.prefix).toEqual({ queries: 133, hits: 64 });
  });

  it("lets a prompt admitted in the same step hit blocks scheduled before it (vLLM V1 caches at schedule time)", () => {
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 1000 }, new KvCache(100, 16));
    for (const id of ["c0", "c1", "c2"]) s.add(spec(id, range(50), 1));
    expect(drain(s)[0]).toEqual({ c0: 50, c1: 2, c2: 2 }); // 48 tokens = 3 blocks from c0, in the same step
    expect(s.prefix).toEqual({ queries: 150, hits: 96 });
  });

  it("counts the prompt of a group (an n > 1 request) once, at the first token of any of its choices", () => {
    const core = new EngineCore(cfg({ numBlocks: 100 }));
    const group = { promptCounted: false };
    for (const id of ["a", "b"]) core.submit(spec(id, range(20), 2, { group }));
    core.submit(spec("alone", range(7, 500), 2));
    for (let t = 1; core.hasWork(); t++) core.finishStep(core.startStep()!.seconds * t);
    expect(core.metrics.promptTokens).toBe(20 + 7);
    expect(core.metrics.generationTokens).toBe(6);
  });

  it("always computes the last prompt token even when the whole prompt is cached", () => {
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 1000 }, new KvCache(100, 16));
    s.add(spec("a", range(32), 1));
    drain(s);
    s.add(spec("b", range(32), 1));
    expect(drain(s)[0]).toEqual({ b: 16 }); // hits limited to tokens[0..31): one block
  });

  it("isolates cache_salt", () => {
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 1000 }, new KvCache(100, 16));
    s.add(spec("a", range(40), 1, { cacheSalt: 1 }));
    drain(s);
    s.add(spec("b", range(40), 1, { cacheSalt: 2 }));
    expect(drain(s)[0]).toEqual({ b: 40 });
  });

  it("preempts the newest running sequence when blocks run out, and finishes everyone", () => {
    // 6 blocks of 4 tokens = 24 tokens; two sequences that each grow to 4 + 12 = 16 tokens cannot both fit.
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 100 }, new KvCache(6, 4));
    s.add(spec("a", range(4), 12));
    s.add(spec("b", range(4, 100), 12));
    const out: Record<string, number> = {};
    for (let t = 1; s.hasWork() && t < 200; t++) {
      const plan = s.plan()!;
      for (const ev of s.complete(plan, t))
        if (ev.kind === "token") out[ev.seq.spec.id] = (out[ev.seq.spec.id] ?? 0) + 1;
    }
    expect(s.preemptions).toBeGreaterThan(0);
    expect(out).toEqual({ a: 12, b: 12 });
    expect(s.kv.usage()).toBe(0);
  });

  it("waits instead of admitting when the queue head does not fit", () => {
    const s = new Scheduler({ maxNumSeqs: 8, maxNumBatchedTokens: 1000 }, new KvCache(4, 4));
    s.add(spec("big", range(12), 4)); // 3 blocks
    s.add(spec("next", range(8, 50), 4)); // 2 blocks: must wait
    const first = s.plan()!;
    expect(first.items.map((i) => i.seq.spec.id)).toEqual(["big"]);
    expect(s.numWaiting).toBe(1);
    s.complete(first, 1);
  });

  it("stops generating within one step of an abort and does not count the discarded token", () => {
    const core = new EngineCore(cfg({ numBlocks: 100 }));
    core.submit(spec("a", range(10), 100));
    let step = core.startStep()!;
    core.finishStep(step.seconds);
    step = core.startStep()!; // decode step in flight
    core.cancel("a", "abort", 0.01);
    const events = core.finishStep(0.02);
    expect(events.map((e) => e.kind)).toEqual(["aborted"]);
    expect(core.metrics.generationTokens).toBe(1);
    expect(core.metrics.promptTokens).toBe(10);
    expect(core.metrics.success.abort).toBe(1);
    expect(core.hasWork()).toBe(false);
  });
});

function cfg(over: Partial<EngineCoreConfig> = {}): EngineCoreConfig {
  return { ...DEFAULT_H100_8B_CORE, ...over };
}

describe("closed-loop prediction", () => {
  it("matches hand arithmetic for one stream", () => {
    const r = simulateClosedLoop(cfg(), {
      concurrency: 1,
      requestsPerClient: 1,
      outputTokens: 3,
      prompt: () => range(100),
    });
    // prefill step: 1 + max(6.2, 100 × 0.022) + 100 × 0.051 / 1000 + 0.032 = 7.2371 ms
    expect(r.ttftMean).toBeCloseTo(0.0072371, 7);
    // decode: 1 + 6.2 + 101 × 0.051 / 1000 + 0.032 = 7.237151 ms, then 102 tokens of context
    expect(r.itlMean).toBeCloseTo((0.007237151 + 0.007237202) / 2, 8);
    expect(r.outputTokens).toBe(3);
  });

  it("gains throughput and loses per-stream speed with concurrency", () => {
    const w = (c: number) =>
      simulateClosedLoop(cfg(), {
        concurrency: c,
        requestsPerClient: 2,
        outputTokens: 64,
        prompt: (cl, r) => range(256, cl * 1e5 + r * 1e3),
      });
    const one = w(1);
    const many = w(32);
    expect(many.outputTokensPerSecond).toBeGreaterThan(5 * one.outputTokensPerSecond);
    expect(many.itlMean).toBeGreaterThan(one.itlMean);
  });
});
