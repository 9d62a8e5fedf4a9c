import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { EdgeModelSchema, EdgeSampleSchema } from "../proto/gen/control/v1/control_pb.ts";
import { alignHistory } from "./edge-series.ts";

const sample = (at: number, saturation: number, queue: Record<string, number>, tps: number) =>
  create(EdgeSampleSchema, {
    atUnixMs: BigInt(at),
    saturation,
    queueDepth: queue,
    generatedTokensPerSecond: tps,
  });

describe("the edge history as plot series", () => {
  const a = create(EdgeModelSchema, {
    model: "a",
    history: [sample(1_000, 0.5, { gold: 2, bronze: 1 }, 40), sample(6_000, -1, {}, 0)],
  });
  const b = create(EdgeModelSchema, { model: "b", history: [sample(3_000, 0.9, { gold: 4 }, 120)] });

  it("shares one x axis in seconds, with a gap where a model has no sample", () => {
    expect(alignHistory([a, b], "tokens")).toEqual([
      [1, 3, 6],
      [40, null, 0],
      [null, 120, null],
    ]);
  });

  it("sums the bands' queues, and leaves saturation out while no endpoint is routable", () => {
    expect(alignHistory([a, b], "queue").slice(1)).toEqual([
      [3, null, 0],
      [null, 4, null],
    ]);
    expect(alignHistory([a], "saturation")).toEqual([
      [1, 6],
      [0.5, null],
    ]);
  });
});
