import { describe, expect, it } from "vitest";
import { type AgentReading, DemandWindow, edgeDelta, MAX_BACKLOG, sampleOf } from "./demand.ts";

const agents = (o: Partial<AgentReading> = {}): AgentReading => ({
  ready: 2,
  scraped: 2,
  saturation: 0.3,
  waiting: 0.5,
  kvUsage: 0.2,
  ...o,
});
const edge = (
  at: number,
  o: { saturation?: number; queued?: number; admitted?: number; shed?: number } = {},
) => ({
  at,
  saturation: o.saturation,
  queued: o.queued ?? 0,
  admitted: o.admitted ?? 0,
  shed: o.shed ?? 0,
});

describe("one demand sample", () => {
  it("is the higher saturation times the ready replicas when nothing waits", () => {
    const d = edgeDelta(edge(0, { admitted: 10 }), edge(5000, { saturation: 0.6, admitted: 40 }));
    expect(d).toEqual({ saturation: 0.6, queued: 0, admitted: 30, shed: 0, backlog: 1 });
    const s = sampleOf(5000, d, "", agents());
    expect(s.demand).toBeCloseTo(1.2);
    expect(s.sources).toEqual([
      "edge: saturation 0.60, 0 queued, 0 shed and 30 admitted since the previous poll",
      "agents: 2 of 2 ready replica(s) scraped, waiting 0.5, KV 20%",
    ]);
    // Scraped figures only ever raise it.
    expect(sampleOf(5000, d, "", agents({ saturation: 0.9 })).demand).toBeCloseTo(1.8);
  });

  it("grows by what the fleet could not take in: queued and shed over admitted", () => {
    const d = edgeDelta(
      edge(0, { admitted: 100, shed: 5 }),
      edge(5000, { saturation: 0.9, admitted: 120, shed: 15, queued: 10 }),
    );
    // (20 admitted + 10 shed + 10 queued) / 20 admitted = 2.
    expect(d.backlog).toBe(2);
    expect(sampleOf(5000, d, "", agents()).demand).toBeCloseTo(0.9 * 2 * 2);
  });

  it("caps the backlog, and reads a pool that restarted (counters went down) as counting from zero", () => {
    const d = edgeDelta(edge(0, { admitted: 500 }), edge(5000, { saturation: 1, admitted: 3, queued: 400 }));
    expect(d.admitted).toBe(3);
    expect(d.backlog).toBe(MAX_BACKLOG);
  });

  it("decides on the agents alone without the edge, and says why the edge is missing", () => {
    const s = sampleOf(1, undefined, "no edge link (edge.url is not set)", agents({ saturation: 0.5 }));
    expect(s.demand).toBeCloseTo(1);
    expect(s.sources[0]).toBe("edge: no edge link (edge.url is not set)");
  });

  it("decides on the edge alone without a fresh scrape", () => {
    const d = edgeDelta(undefined, edge(0, { saturation: 0.4 }));
    const s = sampleOf(1, d, "", agents({ scraped: 0 }));
    expect(s.demand).toBeCloseTo(0.8);
    expect(s.sources[1]).toBe("agents: no fresh scrape of a ready replica");
  });

  it("has no demand with neither source, nor with no ready replica", () => {
    expect(sampleOf(1, undefined, "not polled yet", agents({ scraped: 0 })).demand).toBeUndefined();
    const d = edgeDelta(undefined, edge(0, { saturation: 0.4 }));
    expect(sampleOf(1, d, "", agents({ ready: 0, scraped: 0 })).demand).toBeUndefined();
  });
});

describe("the window", () => {
  it("keeps the window's samples: their mean, their trend, how much they cover", () => {
    const w = new DemandWindow();
    expect(w.signal()).toBeUndefined();
    for (let t = 0; t <= 120_000; t += 10_000)
      w.add({ at: t, demand: t / 60_000, ready: 1, sources: [] }, 60_000);
    const s = w.signal()!;
    expect(s.samples).toBe(7);
    expect(s.coveredMs).toBe(60_000);
    expect(s.demand).toBeCloseTo(1.5);
    expect(s.trendPerMs * 60_000).toBeCloseTo(1);
  });

  it("a sample without demand leaves the signal and updates the sources", () => {
    const w = new DemandWindow();
    w.add({ at: 0, demand: 1, ready: 1, sources: ["a"] }, 60_000);
    w.add({ at: 5_000, demand: undefined, ready: 0, sources: ["b"] }, 60_000);
    expect(w.signal()).toMatchObject({ demand: 1, samples: 1, sources: ["b"] });
  });
});
