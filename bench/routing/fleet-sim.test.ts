import { describe, expect, it } from "vitest";
import { routerSchema } from "../../edge/config/router.ts";
import { sharedPrefix } from "../../loadgen/workloads.ts";
import { DEFAULT_H100_8B_CORE } from "../../sim-engine/engine-core.ts";
import { chatPromptTokens } from "../../sim-engine/text.ts";
import { promptTokenizer, type SimRequest, simulateFleet } from "./fleet-sim.ts";

const requests = (rate: number, count: number): SimRequest[] =>
  sharedPrefix({
    groups: 4,
    usersPerGroup: 2,
    systemTokens: 600,
    questionTokens: 40,
    outputTokens: 16,
    turns: 2,
    ignoreEos: true,
  })
    .requests({ rate, count, seed: 3 })
    .map((r) => ({ ...r, at: r.at * 1000 }));

describe("fleet simulation", () => {
  it("tokenizes prompts exactly as the sim engine's chat template does", () => {
    const t = promptTokenizer();
    for (const r of requests(1, 6)) expect(t(r.messages)).toEqual(chatPromptTokens(r.messages));
  });

  it("serves every request to its length, deterministically by seed, and warms the prefix cache", () => {
    const opts = {
      engines: 3,
      core: DEFAULT_H100_8B_CORE,
      policy: "chat" as const,
      settings: routerSchema.parse({}),
    };
    const reqs = requests(20, 60);
    const a = simulateFleet(opts, reqs);
    const b = simulateFleet(opts, reqs);
    expect(a).toEqual(b);
    expect(a.requests).toHaveLength(60);
    for (const r of a.requests) {
      expect([r.status, r.outputTokens]).toEqual([200, 16]);
      expect(r.firstToken! >= r.arrival && r.end! >= r.firstToken!).toBe(true);
      expect(r.gaps).toHaveLength(15);
    }
    const hits = a.engines.reduce((s, e) => s + e.prefixHits, 0);
    expect(hits).toBeGreaterThan(0);
    expect(a.engines.reduce((s, e) => s + e.requests, 0)).toBe(60);
  });

  it("refusals come back as the pool's status: a full queue is a 429", () => {
    const settings = routerSchema.parse({
      scoring: { target_inflight: 1 },
      admission: { queue_capacity_per_band: 1 },
    });
    const reqs = requests(1, 5).map((r) => ({ ...r, at: 0 }));
    const res = simulateFleet({ engines: 1, core: DEFAULT_H100_8B_CORE, policy: "chat", settings }, reqs);
    const statuses = res.requests.map((r) => r.status).sort();
    expect(statuses).toContain(429);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(2);
  });
});
