import { describe, expect, it } from "vitest";
import { formatTable, LevelStats, percentile, type RequestResult, summarize } from "./stats.ts";

const ok = (over: Partial<RequestResult> = {}): RequestResult => ({
  ok: true,
  status: 200,
  ttft: 0.1,
  e2e: 1,
  itl: [0.01, 0.01],
  outputTokens: 3,
  promptTokens: 100,
  ...over,
});

describe("percentile (nearest rank)", () => {
  const ten = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

  it("returns the sample at rank ⌈p/100 · n⌉", () => {
    expect(percentile(ten, 50)).toBe(5);
    expect(percentile(ten, 90)).toBe(9);
    expect(percentile(ten, 91)).toBe(10);
    expect(percentile(ten, 99)).toBe(10);
    expect(percentile(ten, 100)).toBe(10);
    expect(percentile(ten, 0)).toBe(1);
  });

  it("never interpolates, and is null without samples", () => {
    expect(percentile([1, 100], 50)).toBe(1);
    expect(percentile([7], 99)).toBe(7);
    expect(percentile([], 50)).toBeNull();
  });
});

describe("a level's summary", () => {
  it("counts successes and errors by key, keeps the first error's message", () => {
    const s = summarize(
      { kind: "concurrency", value: 4 },
      [
        ok(),
        {
          ok: false,
          status: 429,
          error: "429 rate_limit_exceeded",
          errorMessage: "429: slow down",
          e2e: 0.01,
          outputTokens: 0,
        },
        {
          ok: false,
          status: 0,
          error: "ECONNREFUSED",
          errorMessage: "connect ECONNREFUSED",
          e2e: 0,
          outputTokens: 0,
        },
        { ok: false, status: 429, error: "429 rate_limit_exceeded", e2e: 0.01, outputTokens: 0 },
      ],
      2,
    );
    expect(s.requests).toBe(4);
    expect(s.completed).toBe(1);
    expect(s.successRate).toBe(0.25);
    expect(s.errors).toEqual({ "429 rate_limit_exceeded": 2, ECONNREFUSED: 1 });
    expect(s.firstError).toBe("429: slow down");
    expect(s.achievedRps).toBe(0.5);
  });

  it("counts output tokens of every request, failed ones too, per second of the level", () => {
    const s = summarize(
      { kind: "rate", value: 1 },
      [ok({ outputTokens: 30 }), { ok: false, status: 200, error: "stream cut", e2e: 1, outputTokens: 10 }],
      4,
    );
    expect(s.outputTokens).toBe(40);
    expect(s.outputTokensPerSecond).toBe(10);
    expect(s.promptTokens).toBe(100);
    expect(s.cachedTokens).toBeUndefined();
  });

  it("takes ITL percentiles over all gaps pooled, not over per-request means", () => {
    // Nine short smooth streams (10 gaps of 10 ms) and one long slow one (100 gaps of 500 ms):
    // per-request means would put the median at 10 ms; pooled, most gaps are slow ones.
    const smooth = Array.from({ length: 9 }, () => ok({ itl: Array(10).fill(0.01) }));
    const slow = ok({ itl: Array(100).fill(0.5) });
    const s = summarize({ kind: "concurrency", value: 1 }, [...smooth, slow], 1);
    expect(s.itl).toEqual({ p50: 0.5, p90: 0.5, p99: 0.5 });
    const fewer = summarize(
      { kind: "concurrency", value: 1 },
      [...smooth, ok({ itl: Array(80).fill(0.5) })],
      1,
    );
    // 90 fast and 80 slow gaps: rank ⌈0.5 · 170⌉ = 85 is still a fast one.
    expect(fewer.itl.p50).toBe(0.01);
    expect(fewer.itl.p90).toBe(0.5);
  });

  it("takes TTFT and E2E only from successful requests", () => {
    const s = summarize(
      { kind: "concurrency", value: 1 },
      [
        ok({ ttft: 0.2, e2e: 2 }),
        ok({ ttft: 0.4, e2e: 3 }),
        { ok: false, status: 500, ttft: 9, e2e: 9, outputTokens: 0 },
      ],
      1,
    );
    expect(s.ttft).toEqual({ p50: 0.2, p90: 0.4, p99: 0.4 });
    expect(s.e2e.p50).toBe(2);
    expect(s.errors).toEqual({ "status 500": 1 });
  });

  it("spreads requests over endpoints (max/mean) and counts routes and admissions, from the recorded headers", () => {
    const h = (endpoint: string, route: string, admitted = "pool") =>
      ok({ headers: { "x-llmgw-endpoint": endpoint, "x-llmgw-route": route, "x-llmgw-admitted": admitted } });
    const rs = [h("a", "prefix"), h("a", "prefix", "grant"), h("a", "load", "grant"), h("b", "session")];
    const s = summarize({ kind: "rate", value: 2 }, rs, 1);
    expect(s.endpoints).toEqual({ counts: { a: 3, b: 1 }, maxOverMean: 1.5 });
    expect(s.routes).toEqual({ prefix: 2, load: 1, session: 1 });
    expect(s.admitted).toEqual({ pool: 2, grant: 2 });
    // An endpoint the caller knows of that got nothing counts as 0 in the mean.
    const known = summarize({ kind: "rate", value: 2 }, rs, 1, ["a", "b", "c", "d"]);
    expect(known.endpoints!.counts).toEqual({ a: 3, b: 1, c: 0, d: 0 });
    expect(known.endpoints!.maxOverMean).toBe(3);
    expect(summarize({ kind: "rate", value: 2 }, [ok()], 1).endpoints).toBeUndefined();
  });

  it("breaks the figures down per requested band", () => {
    const s = summarize(
      { kind: "rate", value: 4 },
      [
        ok({ band: "bronze", ttft: 3 }),
        ok({ band: "platinum", ttft: 0.1 }),
        { ok: false, status: 503, error: "503 queue_timeout", e2e: 30, outputTokens: 0, band: "bronze" },
        ok({ band: "platinum", ttft: 0.2 }),
      ],
      2,
    );
    expect(s.requests).toBe(4);
    expect(Object.keys(s.bands!).sort()).toEqual(["bronze", "platinum"]);
    expect(s.bands!.platinum).toMatchObject({ requests: 2, completed: 2, ttft: { p50: 0.1, p99: 0.2 } });
    expect(s.bands!.bronze).toMatchObject({ requests: 2, completed: 1, errors: { "503 queue_timeout": 1 } });
    expect(s.bands!.bronze!.bands).toBeUndefined();
    const text = formatTable([s]);
    const perBand = text.slice(text.indexOf("per band:")).split("\n");
    expect(perBand[1]).toMatch(/^load\s+band\s+sent\s+ok %\s+TTFT p50 ms/);
    // Highest priority first.
    expect(perBand[2]).toMatch(/^4 req\/s\s+platinum\s+2\s+100\.0\s+100\s/);
    expect(perBand[3]).toMatch(/^4 req\/s\s+bronze\s+2\s+50\.0\s+3000\s.*503 queue_timeout:1$/);
    expect(formatTable([summarize({ kind: "rate", value: 1 }, [ok()], 1)])).not.toContain("per band");
  });

  it("sums cached prompt tokens only when the server reports them", () => {
    const st = new LevelStats({ kind: "rate", value: 1 });
    st.add(ok({ cachedTokens: 60 }));
    st.add(ok());
    expect(st.summary(1).cachedTokens).toBe(60);
  });

  it("keeps many gaps without losing any", () => {
    const st = new LevelStats({ kind: "concurrency", value: 1 });
    for (let i = 0; i < 300; i++)
      st.add(ok({ itl: Float64Array.from({ length: 100 }, (_, j) => (i * 100 + j) / 1e6) }));
    const s = st.summary(1);
    expect(s.itl.p50).toBeCloseTo(14_999 / 1e6, 12);
    expect(s.itl.p99).toBeCloseTo(29_699 / 1e6, 12);
  });
});

describe("the table", () => {
  it("prints one aligned row per level, with times in ms", () => {
    const levels = [
      summarize({ kind: "rate", value: 1 }, [ok({ ttft: 0.0123, e2e: 0.5 })], 10),
      summarize(
        { kind: "rate", value: 16 },
        [
          ok({ ttft: 1.5, e2e: 3 }),
          { ok: false, status: 503, error: "503 no_capacity", e2e: 0, outputTokens: 0 },
        ],
        10,
      ),
    ];
    const lines = formatTable(levels).trimEnd().split("\n");
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatch(/^load\s+sent\s+ok %\s+req\/s\s+out tok\/s\s+TTFT p50 ms/);
    expect(lines[1]).toMatch(/^1 req\/s\s+1\s+100\.0\s+0\.10\s+0\.30\s+12\.3\s/);
    expect(lines[2]).toMatch(/^16 req\/s\s+2\s+50\.0\s.*\s1500\s.*503 no_capacity:1$/);
    // Columns line up: every row's "sent" starts where the header's does.
    const col = lines[0]!.indexOf("sent");
    for (const l of lines.slice(1)) expect(l.slice(col - 2, col)).toBe("  ");
    expect(lines[0]).not.toMatch(/cached|endpoints|routes|admitted/);
  });

  it("adds the cache, endpoint, route and admitted columns only when some level has them", () => {
    const s = summarize(
      { kind: "concurrency", value: 2 },
      [ok({ cachedTokens: 50, headers: { "x-llmgw-endpoint": "e1", "x-llmgw-route": "prefix" } })],
      1,
    );
    const [head, row] = formatTable([s]).split("\n");
    expect(head).toMatch(/cached %\s+endpoints max\/mean\s+routes\s+errors$/);
    expect(row).toMatch(/\s50\.0\s+1\.00 \(1\)\s+prefix:1\s+-$/);
    const admitted = summarize(
      { kind: "concurrency", value: 2 },
      [ok({ headers: { "x-llmgw-route": "load", "x-llmgw-admitted": "grant" } })],
      1,
    );
    const [head2, row2] = formatTable([admitted]).split("\n");
    expect(head2).toMatch(/routes\s+admitted\s+errors$/);
    expect(row2).toMatch(/\sload:1\s+grant:1\s+-$/);
  });
});
