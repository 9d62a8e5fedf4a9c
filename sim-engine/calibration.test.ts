import { beforeAll, describe, expect, it } from "vitest";
import { mulberry32 } from "../common/rng.ts";
import {
  type CalibrationRow,
  calibrate,
  describeWorkload,
  drawLengths,
  fp8Weights,
  modelFigure,
  PUBLISHED_POINTS,
  TOLERANCE,
} from "./calibration.ts";
import { H100_LLAMA_3_1_8B } from "./latency-model.ts";

describe("calibration against published vLLM figures", () => {
  let rows: CalibrationRow[] = [];
  beforeAll(() => {
    rows = calibrate();
  }, 120_000);

  it("computes the model's figure for every point", () => {
    expect(rows.map((r) => r.point.id)).toEqual(PUBLISHED_POINTS.map((p) => p.id));
    for (const r of rows) {
      expect(Number.isFinite(r.model) && r.model > 0).toBe(true);
      expect(r.ratio).toBeCloseTo(r.model / r.point.published, 12);
      expect(r.within).toBe(Math.abs(r.ratio - 1) <= TOLERANCE);
    }
  });

  it("puts every V1-era point within ±20 % with the default parameters", () => {
    const v1 = rows.filter((r) => r.point.era === "V1");
    expect(v1.map((r) => r.point.id)).toEqual(["1a", "1b", "6a", "6b", "6c", "6d", "9"]);
    const out = v1.filter((r) => !r.within).map((r) => `#${r.point.id}: ${r.ratio.toFixed(2)}`);
    expect(out).toEqual([]);
  });

  it("would have failed the old per-sequence cost (60 µs) at 40–50 QPS", () => {
    const old = { ...H100_LLAMA_3_1_8B, perSequenceUs: 60 };
    for (const id of ["6c", "6d"]) {
      const p = PUBLISHED_POINTS.find((x) => x.id === id)!;
      expect(modelFigure(p, old) / p.published).toBeGreaterThan(1 + TOLERANCE);
    }
  }, 60_000);

  it("is deterministic", () => {
    const p = PUBLISHED_POINTS.find((x) => x.id === "1b")!;
    expect(modelFigure(p)).toBe(rows.find((r) => r.point.id === "1b")!.model);
  });

  it("describes what the model runs for a point", () => {
    const p = PUBLISHED_POINTS.find((x) => x.id === "9")!;
    expect(describeWorkload(p)).toBe(
      "1,000 requests at t = 0; in 778 (lognormal σ 0.4) / out 73 (lognormal σ 0.4) tokens; " +
        "1,024 seqs, 16,384 tokens a step, memory 0.9; FP8 weights (fp8Weights)",
    );
  });
});

describe("workload pieces", () => {
  it("draws lengths with the requested mean, inside the clip", () => {
    const l = { mean: 215, sigma: 1, min: 4, max: 1024 };
    const xs = drawLengths(l, 1000, mulberry32(7));
    const mean = xs.reduce((s, x) => s + x, 0) / xs.length;
    expect(Math.abs(mean - 215)).toBeLessThan(1);
    expect(Math.min(...xs)).toBeGreaterThanOrEqual(4);
    expect(Math.max(...xs)).toBeLessThanOrEqual(1024);
    expect(new Set(xs).size).toBeGreaterThan(100);
    expect(drawLengths(l, 1000, mulberry32(7))).toEqual(xs);
    expect(drawLengths({ mean: 256, sigma: 0, min: 256, max: 256 }, 3, mulberry32(1))).toEqual([
      256, 256, 256,
    ]);
  });

  it("derives FP8 parameters from BF16: half the weight bytes, twice the FLOP/s", () => {
    const f = fp8Weights(H100_LLAMA_3_1_8B);
    expect(f.weightsReadMs).toBe(H100_LLAMA_3_1_8B.weightsReadMs / 2);
    expect(f.computeUsPerToken).toBe(H100_LLAMA_3_1_8B.computeUsPerToken / 2);
    expect(f.kvReadUsPerToken).toBe(H100_LLAMA_3_1_8B.kvReadUsPerToken);
    expect(f.overheadMs).toBe(H100_LLAMA_3_1_8B.overheadMs);
    expect(f.perSequenceUs).toBe(H100_LLAMA_3_1_8B.perSequenceUs);
  });
});
