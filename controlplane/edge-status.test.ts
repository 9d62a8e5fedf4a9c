import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { type PoolStatus, PoolStatusSchema } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { EdgeStatusBook, HISTORY_MS } from "./edge-status.ts";

const EDGE = { url: "http://edge", intervalMs: 5_000 };

function pool(model: string, saturation: number, depths: Record<string, number> = {}): PoolStatus {
  return create(PoolStatusSchema, {
    model,
    saturation,
    bands: Object.entries(depths).map(([name, depth]) => ({ name, depth })),
  });
}

describe("EdgeStatusBook", () => {
  it("keeps the latest pool per model with its age, and a sample per poll", () => {
    const b = new EdgeStatusBook();
    b.record([pool("a", 0.5, { gold: 2, bronze: 7 }), pool("b", -1)], [], 1_000);
    b.record([pool("a", 0.9, { gold: 3, bronze: 9 }), pool("b", 0.1)], [], 6_000);
    const v = b.view(8_500, EDGE);
    expect(v.configured).toBe(true);
    expect(v.models.map((m) => m.model)).toEqual(["a", "b"]);
    const a = v.models[0]!;
    expect(a.pool?.saturation).toBe(0.9);
    expect(a.polledAtUnixMs).toBe(6_000n);
    expect(a.ageMs).toBe(2_500n);
    expect(a.history.map((s) => [Number(s.atUnixMs), s.saturation, s.queueDepth])).toEqual([
      [1_000, 0.5, { gold: 2, bronze: 7 }],
      [6_000, 0.9, { gold: 3, bronze: 9 }],
    ]);
    expect(b.view(8_500, EDGE, "b").models.map((m) => m.model)).toEqual(["b"]);
  });

  it("drops a model the edge stops reporting, history and all", () => {
    const b = new EdgeStatusBook();
    b.record([pool("a", 0.1), pool("b", 0.2)], [], 1_000);
    b.record([pool("a", 0.1)], [], 2_000);
    expect(b.pools().map((p) => p.model)).toEqual(["a"]);
    b.record([pool("a", 0.1), pool("b", 0.3)], [], 3_000);
    expect(b.view(3_000, EDGE, "b").models[0]!.history).toHaveLength(1);
  });

  it("keeps fifteen minutes of samples", () => {
    const b = new EdgeStatusBook();
    for (let t = 0; t <= 20 * 60_000; t += 5_000) b.record([pool("a", 0.5)], [], t);
    const h = b.view(20 * 60_000, EDGE).models[0]!.history;
    expect(Number(h[0]!.atUnixMs)).toBe(20 * 60_000 - HISTORY_MS + 5_000);
    expect(h).toHaveLength(HISTORY_MS / 5_000);
  });

  it("turns the engines' token counters into tokens per second per model, across a restart", () => {
    const b = new EdgeStatusBook();
    const rate = (t: number) => b.view(t, EDGE).models.map((m) => m.history.at(-1)!.generatedTokensPerSecond);
    b.record(
      [pool("a", 0), pool("b", 0)],
      [
        { model: "a", replica: "a-1", tokens: 1_000 },
        { model: "a", replica: "a-2", tokens: 50 },
      ],
      0,
    );
    // The first sample has nothing to compare with.
    expect(rate(0)).toEqual([0, 0]);
    b.record(
      [pool("a", 0), pool("b", 0)],
      [
        { model: "a", replica: "a-1", tokens: 1_400 },
        { model: "a", replica: "a-2", tokens: 150 },
        { model: "b", replica: "b-1", tokens: 9_999 },
      ],
      5_000,
    );
    // a: (400 + 100) / 5 s; b-1 is new, its lifetime count is not this interval's.
    expect(rate(5_000)).toEqual([100, 0]);
    b.record(
      [pool("a", 0), pool("b", 0)],
      [
        { model: "a", replica: "a-1", tokens: 30 },
        { model: "b", replica: "b-1", tokens: 10_099 },
      ],
      10_000,
    );
    // a-1 restarted (counted from 0): 30 tokens; b: 100 tokens.
    expect(rate(10_000)).toEqual([6, 20]);
  });

  it("keeps the last error until the next success, and counts failures", () => {
    const b = new EdgeStatusBook();
    expect(b.ageMs(0)).toBeUndefined();
    b.failed("connect ECONNREFUSED", 1_000);
    b.failed("connect ECONNREFUSED", 2_000);
    let v = b.view(2_000, EDGE);
    expect([v.lastError, v.lastErrorAtUnixMs, v.pollErrors, v.lastSuccessAtUnixMs]).toEqual([
      "connect ECONNREFUSED",
      2_000n,
      2n,
      0n,
    ]);
    b.record([pool("a", 0.2)], [], 3_000);
    b.failed("deadline_exceeded", 4_000);
    // A failed poll leaves the last pools (and their age grows).
    v = b.view(9_000, EDGE);
    expect(v.models[0]!.ageMs).toBe(6_000n);
    expect(v.lastError).toBe("deadline_exceeded");
    b.record([pool("a", 0.2)], [], 10_000);
    v = b.view(10_000, EDGE);
    expect([v.lastError, v.pollErrors, b.ageMs(10_500)]).toEqual(["", 3n, 500]);
  });
});
