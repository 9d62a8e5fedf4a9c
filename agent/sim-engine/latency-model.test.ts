import { describe, expect, it } from "vitest";
import {
  H100_80GB_LLAMA_3_1_8B_MEMORY,
  H100_LLAMA_3_1_8B,
  kvBlocksFor,
  scaleForParallelism,
  stepSeconds,
} from "./latency-model.ts";

const p = {
  overheadMs: 0.5,
  weightsReadMs: 5.7,
  computeUsPerToken: 32,
  kvReadUsPerToken: 0.05,
  perSequenceUs: 60,
};

describe("latency model", () => {
  it("prices a single decode step at the memory roofline", () => {
    // 0.5 + max(5.7, 1 × 0.032) + 1000 × 0.05 / 1000 + 60 / 1000 = 6.31 ms
    expect(stepSeconds(p, { sequences: 1, tokens: 1, contextTokens: 1000 })).toBeCloseTo(0.00631, 9);
  });

  it("grows with the batch: 64 decoding sequences of 600-token context", () => {
    // 0.5 + max(5.7, 64 × 0.032 = 2.048) + 38400 × 0.05 / 1000 = 1.92 + 64 × 0.06 = 3.84 → 11.96 ms
    expect(stepSeconds(p, { sequences: 64, tokens: 64, contextTokens: 38_400 })).toBeCloseTo(0.01196, 9);
  });

  it("turns compute bound on a prefill chunk", () => {
    // 0.5 + max(5.7, 8192 × 0.032 = 262.144) + 8192 × 0.05 / 1000 = 0.4096 + 0.06 → 263.1136 ms
    expect(stepSeconds(p, { sequences: 1, tokens: 8192, contextTokens: 8192 })).toBeCloseTo(0.2631136, 9);
  });

  it("costs nothing for an empty step", () => {
    expect(stepSeconds(p, { sequences: 0, tokens: 0, contextTokens: 0 })).toBe(0);
  });

  it("splits work over tensor-parallel GPUs with 10 % loss per doubling", () => {
    const tp4 = scaleForParallelism(p, 4, 1);
    // speed-up 4 × 0.9² = 3.24
    expect(tp4.weightsReadMs).toBeCloseTo(5.7 / 3.24, 9);
    expect(tp4.overheadMs).toBe(0.5);
    expect(scaleForParallelism(p, 1, 1)).toEqual(p);
  });

  it("sizes the KV cache like vLLM: 80 GiB × 0.9 − 3 GiB − 16.06 GB over 2 MiB blocks", () => {
    // (77,309,411,328 − 3,221,225,472 − 16,060,000,000) / (131,072 × 16) = 27,669.99…
    expect(kvBlocksFor(H100_80GB_LLAMA_3_1_8B_MEMORY, 0.9, 1, 16)).toBe(27_669);
    expect(kvBlocksFor(H100_80GB_LLAMA_3_1_8B_MEMORY, 0.2, 1, 16)).toBe(0);
  });

  it("defaults give ~160 tok/s for one stream", () => {
    const s = stepSeconds(H100_LLAMA_3_1_8B, { sequences: 1, tokens: 1, contextTokens: 600 });
    expect(1 / s).toBeGreaterThan(150);
    expect(1 / s).toBeLessThan(165);
  });
});
