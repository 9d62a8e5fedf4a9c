import { describe, expect, it } from "vitest";
import {
  H100_80GB_LLAMA_3_1_8B_MEMORY,
  H100_LLAMA_3_1_8B,
  kvBlocksFor,
  scaleForParallelism,
  stepSeconds,
} from "./latency-model.ts";

const p = {
  overheadMs: 1,
  weightsReadMs: 6.2,
  computeUsPerToken: 22,
  kvReadUsPerToken: 0.05,
  perSequenceUs: 32,
};

describe("latency model", () => {
  it("prices a single decode step at the memory roofline", () => {
    // 1 + max(6.2, 1 × 0.022) + 1000 × 0.05 / 1000 + 32 / 1000 = 7.282 ms
    expect(stepSeconds(p, { sequences: 1, tokens: 1, contextTokens: 1000 })).toBeCloseTo(0.007282, 9);
  });

  it("grows with the batch: 64 decoding sequences of 600-token context", () => {
    // 1 + max(6.2, 64 × 0.022 = 1.408) + 38400 × 0.05 / 1000 = 1.92 + 64 × 0.032 = 2.048 → 11.168 ms
    expect(stepSeconds(p, { sequences: 64, tokens: 64, contextTokens: 38_400 })).toBeCloseTo(0.011168, 9);
  });

  it("turns compute bound on a prefill chunk", () => {
    // 1 + max(6.2, 8192 × 0.022 = 180.224) + 8192 × 0.05 / 1000 = 0.4096 + 0.032 → 181.6656 ms
    expect(stepSeconds(p, { sequences: 1, tokens: 8192, contextTokens: 8192 })).toBeCloseTo(0.1816656, 9);
  });

  it("costs nothing for an empty step", () => {
    expect(stepSeconds(p, { sequences: 0, tokens: 0, contextTokens: 0 })).toBe(0);
  });

  it("splits work over tensor-parallel GPUs with 10 % loss per doubling", () => {
    const tp4 = scaleForParallelism(p, 4, 1);
    // speed-up 4 × 0.9² = 3.24
    expect(tp4.weightsReadMs).toBeCloseTo(6.2 / 3.24, 9);
    expect(tp4.overheadMs).toBe(1);
    expect(scaleForParallelism(p, 1, 1)).toEqual(p);
  });

  it("sizes the KV cache like vLLM: 80 GiB × 0.9 − 3 GiB − 16.06 GB over 2 MiB blocks", () => {
    // (77,309,411,328 − 3,221,225,472 − 16,060,000,000) / (131,072 × 16) = 27,669.99…
    expect(kvBlocksFor(H100_80GB_LLAMA_3_1_8B_MEMORY, 0.9, 1, 16)).toBe(27_669);
    expect(kvBlocksFor(H100_80GB_LLAMA_3_1_8B_MEMORY, 0.2, 1, 16)).toBe(0);
  });

  it("defaults give a 7.26 ms step (~138 tok/s) for one stream", () => {
    // 1 + 6.2 + 600 × 0.051 / 1000 + 32 / 1000 = 7.2626 ms: between vLLM 0.21's 6.48 ms and the V1 alpha's ~8.5 ms
    const s = stepSeconds(H100_LLAMA_3_1_8B, { sequences: 1, tokens: 1, contextTokens: 600 });
    expect(s).toBeCloseTo(0.0072626, 9);
  });
});
