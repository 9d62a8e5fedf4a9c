import { describe, expect, it } from "vitest";
import { chatPromptTokens, tokenize } from "../sim-engine/text.ts";
import { bandMix, randomPrompts, sharedPrefix, tag, type WorkloadRequest } from "./workloads.ts";

/** BOS, <start_header>, role, <end_header>: what every prompt of one first role shares by template alone. */
const TEMPLATE_PREFIX = 4;

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

const byKey = <T>(xs: T[], key: (x: T) => string | number | undefined) => {
  const m = new Map<string | number | undefined, T[]>();
  for (const x of xs) m.set(key(x), [...(m.get(key(x)) ?? []), x]);
  return m;
};

describe("shared-prefix", () => {
  const o = {
    groups: 4,
    usersPerGroup: 3,
    systemTokens: 600,
    questionTokens: 80,
    outputTokens: 50,
    turns: 3,
  };
  const w = sharedPrefix(o);
  const reqs = w.requests({ count: 200, seed: 7 });

  it("is deterministic by seed, with unique ids", () => {
    expect(w.requests({ count: 200, seed: 7 })).toEqual(reqs);
    expect(new Set(reqs.map((r) => r.id)).size).toBe(200);
    const other = w.requests({ count: 200, seed: 8 });
    expect(other[0]!.messages[0]!.content).not.toBe(reqs[0]!.messages[0]!.content);
  });

  it("asks for about the requested number of tokens under the sim engine's tokenizer (±25 %)", () => {
    for (const r of reqs) {
      const k = r.turn!;
      const want = o.systemTokens + (k + 1) * o.questionTokens + k * o.outputTokens;
      const got = chatPromptTokens(r.messages).length;
      expect(got, `turn ${k}`).toBeGreaterThanOrEqual(want * 0.75);
      expect(got, `turn ${k}`).toBeLessThanOrEqual(want * 1.25);
      expect(r.maxTokens).toBe(o.outputTokens);
    }
  });

  it("shares each group's system prompt exactly between its users, and nothing across groups", () => {
    const groups = byKey(reqs, (r) => r.group);
    expect(groups.size).toBe(o.groups);
    const firsts = [...groups.values()].map((rs) => rs[0]!);
    for (const rs of groups.values()) {
      const users = byKey(rs, (r) => r.session);
      expect(users.size).toBeGreaterThan(1);
      const [a, b] = [...users.values()].map((u) => u[0]!);
      // The same string, built once: requests reuse it rather than rebuilding it.
      expect(a!.messages[0]).toBe(b!.messages[0]);
      const shared = commonPrefix(chatPromptTokens(a!.messages), chatPromptTokens(b!.messages));
      expect(shared).toBeGreaterThanOrEqual(tokenize(a!.messages[0]!.content).length + TEMPLATE_PREFIX);
    }
    for (let i = 0; i < firsts.length; i++) {
      for (let j = i + 1; j < firsts.length; j++) {
        const shared = commonPrefix(
          chatPromptTokens(firsts[i]!.messages),
          chatPromptTokens(firsts[j]!.messages),
        );
        expect(shared).toBe(TEMPLATE_PREFIX);
      }
    }
  });

  it("carries a user's earlier turns, so later turns share a longer prefix; a new conversation after the last turn", () => {
    const sessions = byKey(reqs, (r) => r.session);
    let checked = 0;
    for (const rs of sessions.values()) {
      expect(rs.length).toBeLessThanOrEqual(o.turns);
      expect(rs.map((r) => r.turn)).toEqual(rs.map((_, i) => i));
      for (let i = 1; i < rs.length; i++) {
        const prev = rs[i - 1]!.messages;
        const cur = rs[i]!.messages;
        expect(cur.slice(0, prev.length)).toEqual(prev);
        expect(cur.map((m) => m.role)).toEqual([...prev.map((m) => m.role), "assistant", "user"]);
        const answer = tokenize(cur[prev.length]!.content).length;
        expect(answer).toBe(o.outputTokens);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(50);
    const conversations = [...sessions.keys()].filter((s) => String(s).includes("-g0-u0-"));
    expect(conversations.length).toBeGreaterThan(1);
  });

  it("continues the same sequence from `start`", () => {
    const tail = w.requests({ count: 50, seed: 7, start: 150 });
    const strip = (r: WorkloadRequest) => ({ ...r, at: 0 });
    expect(tail.map(strip)).toEqual(reqs.slice(150).map(strip));
  });

  it("single-turn when turns is 1", () => {
    const single = sharedPrefix({ ...o, turns: 1 }).requests({ count: 50, seed: 1 });
    for (const r of single) expect(r.messages.map((m) => m.role)).toEqual(["system", "user"]);
    expect(new Set(single.map((r) => r.session)).size).toBe(50);
  });
});

describe("arrivals", () => {
  it("are Poisson at the given rate: non-decreasing, mean gap 1/rate, exponential spread", () => {
    const rs = randomPrompts({ promptTokens: 5 }).requests({ count: 20_000, seed: 3, rate: 4 });
    const gaps = rs.map((r, i) => r.at - (i === 0 ? 0 : rs[i - 1]!.at));
    expect(Math.min(...gaps)).toBeGreaterThanOrEqual(0);
    const mean = gaps.reduce((s, g) => s + g, 0) / gaps.length;
    expect(mean).toBeGreaterThan(0.25 * 0.97);
    expect(mean).toBeLessThan(0.25 * 1.03);
    // An exponential's standard deviation equals its mean.
    const sd = Math.sqrt(gaps.reduce((s, g) => s + (g - mean) ** 2, 0) / gaps.length);
    expect(sd / mean).toBeGreaterThan(0.95);
    expect(sd / mean).toBeLessThan(1.05);
  });

  it("are all 0 without a rate (closed loop: only the order matters)", () => {
    const rs = sharedPrefix().requests({ count: 20, seed: 3 });
    expect(rs.every((r) => r.at === 0)).toBe(true);
  });
});

describe("random", () => {
  it("makes unique prompts of promptTokens ± spread that share nothing beyond the template", () => {
    const o = { promptTokens: 400, spread: 0.25, outputTokens: 30 };
    const rs = randomPrompts(o).requests({ count: 300, seed: 11 });
    const ids = rs.map((r) => chatPromptTokens(r.messages));
    for (const [i, r] of rs.entries()) {
      expect(r.messages).toHaveLength(1);
      const n = tokenize(r.messages[0]!.content).length;
      expect(n).toBeGreaterThanOrEqual(o.promptTokens * (1 - o.spread));
      expect(n).toBeLessThanOrEqual(o.promptTokens * (1 + o.spread) + 2);
      if (i > 0) expect(commonPrefix(ids[i]!, ids[i - 1]!)).toBe(TEMPLATE_PREFIX);
      expect(r.session).toBeUndefined();
    }
    const lengths = new Set(rs.map((r) => r.messages[0]!.content.length));
    expect(lengths.size).toBeGreaterThan(50);
  });

  it("tags differ within their first four characters for numbers below 36³", () => {
    const seen = new Set<string>();
    for (let n = 0; n < 36 ** 3; n += 7) seen.add(tag("r", n).slice(0, 4));
    expect(seen.size).toBe(Math.ceil(36 ** 3 / 7));
  });
});

describe("band-mix", () => {
  it("labels every request with a band in the given proportions", () => {
    const rs = bandMix({
      base: "random",
      bands: { platinum: 0.1, gold: 0.3, silver: 0.3, bronze: 0.3 },
      promptTokens: 10,
      spread: 0,
      outputTokens: 5,
      ignoreEos: true,
    }).requests({ count: 20_000, seed: 5 });
    const counts = byKey(rs, (r) => r.band);
    expect([...counts.keys()].sort()).toEqual(["bronze", "gold", "platinum", "silver"]);
    expect(counts.get("platinum")!.length / rs.length).toBeCloseTo(0.1, 1);
    expect(counts.get("gold")!.length / rs.length).toBeCloseTo(0.3, 1);
    expect(rs.every((r) => r.ignoreEos)).toBe(true);
  });

  it("can label a shared-prefix sequence, which stays the same sequence", () => {
    const o = {
      groups: 3,
      usersPerGroup: 2,
      systemTokens: 100,
      questionTokens: 10,
      outputTokens: 5,
      turns: 2,
    };
    const mixed = bandMix({ base: "shared-prefix", bands: { gold: 1 }, ignoreEos: false, ...o }).requests({
      count: 30,
      seed: 2,
    });
    const plain = sharedPrefix(o).requests({ count: 30, seed: 2 });
    expect(mixed.map((r) => r.band)).toEqual(Array(30).fill("gold"));
    expect(mixed.map((r) => r.messages)).toEqual(plain.map((r) => r.messages));
  });

  it("refuses a mix with no positive weight", () => {
    expect(() =>
      bandMix({
        base: "random",
        bands: { gold: 0 },
        promptTokens: 1,
        spread: 0,
        outputTokens: 1,
        ignoreEos: false,
      }),
    ).toThrow(/positive weight/);
  });
});
