import { describe, expect, it } from "vitest";
import { DEFAULT_H100_8B_CORE } from "./engine-core.ts";
import { H100_LLAMA_3_1_8B, stepSeconds } from "./latency-model.ts";
import { replayTrace, simulateClosedLoop } from "./predict.ts";

const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

describe("closed-loop prediction, request by request", () => {
  it("gives each request its own output length and records it", () => {
    const r = simulateClosedLoop(DEFAULT_H100_8B_CORE, {
      concurrency: 2,
      requestsPerClient: 3,
      prompt: (c, r) => range(64, c * 1e5 + r * 1e3),
      outputTokens: (c, r) => 5 + c * 10 + r,
    });
    expect(r.requests).toBe(6);
    const lengths = r.perRequest.map((x) => x.outputTokens).sort((a, b) => a - b);
    expect(lengths).toEqual([5, 6, 7, 15, 16, 17]);
    expect(r.outputTokens).toBe(66);
    const e2e = r.perRequest.reduce((s, x) => s + (x.end - x.arrival), 0) / r.perRequest.length;
    expect(r.e2eMean).toBeCloseTo(e2e, 12);
    for (const x of r.perRequest) {
      expect(x.firstToken).toBeGreaterThan(x.arrival);
      expect(x.end).toBeGreaterThanOrEqual(x.firstToken);
    }
  });
});

describe("trace replay", () => {
  it("reports per-request times on the trace's clock", () => {
    // One request alone: its prefill step, then one decode step per further token.
    const r = replayTrace(DEFAULT_H100_8B_CORE, [{ at: 5, prompt: range(100), outputTokens: 3 }]);
    const prefill = stepSeconds(H100_LLAMA_3_1_8B, { sequences: 1, tokens: 100, contextTokens: 100 });
    const decode = (ctx: number) =>
      stepSeconds(H100_LLAMA_3_1_8B, { sequences: 1, tokens: 1, contextTokens: ctx });
    expect(r.perRequest).toHaveLength(1);
    const [x] = r.perRequest;
    expect(x!.arrival).toBe(5);
    expect(x!.firstToken).toBeCloseTo(5 + prefill, 12);
    expect(x!.end).toBeCloseTo(5 + prefill + decode(101) + decode(102), 12);
    expect(r.e2eMean).toBeCloseTo(x!.end - 5, 12);
    expect(r.seconds).toBeCloseTo(x!.end - 5, 12);
  });

  it("runs a burst (every request at once) to the last token", () => {
    const trace = range(40).map((i) => ({ at: 0, prompt: range(200, i * 1e4), outputTokens: 20 }));
    const r = replayTrace(DEFAULT_H100_8B_CORE, trace);
    expect(r.requests).toBe(40);
    expect(r.outputTokens).toBe(800);
    expect(Math.max(...r.perRequest.map((x) => x.end))).toBeCloseTo(r.seconds, 12);
  });
});
