/**
 * A key's TPM and token budget hold against requests whose charge has not
 * landed yet (docs/edge.md, "Admission"), and an RPM refusal's Retry-After
 * is the real time until the window frees. The edge in workerd, real sim
 * engines, the official openai client; assertions on the key's ledger
 * (EdgeSync GetUsage) and the engines' counters.
 */
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import type { ChatCompletionCreateParamsNonStreaming } from "openai/resources/chat/completions";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { TraceRecord } from "../../sim-engine/request-trace.ts";
import { waitUntil } from "../harness/process.ts";
import {
  createKey,
  type EngineCounters,
  engineCounters,
  type FastEdge,
  type Sim,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

// 9 prompt tokens (the sim's Llama-3-shaped template around "hi") + 10
// generated (ignore_eos: exactly max_tokens).
const PER_REQUEST = 19;
const ask = (model: string) =>
  ({
    model,
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 10,
    ignore_eos: true,
  }) as ChatCompletionCreateParamsNonStreaming;

type Result = { ok: true; tokens: number } | { ok: false; status: number; code: string | null };

async function send(client: OpenAI, model: string): Promise<Result> {
  try {
    const r = await client.chat.completions.create(ask(model));
    return { ok: true, tokens: r.usage!.total_tokens };
  } catch (err) {
    if (err instanceof OpenAI.APIError) return { ok: false, status: err.status ?? 0, code: err.code ?? null };
    throw err;
  }
}

function delta(a: EngineCounters, b: EngineCounters) {
  return { tokens: b.prompt + b.generation - a.prompt - a.generation, finished: b.finished - a.finished };
}

describe("key limits", () => {
  let edge: FastEdge;
  let serial: Sim;
  let parallel: Sim;
  let paced: Sim;
  let slow: Sim;
  // The parallel engine's own record of each request: when it arrived and ended.
  const trace = join(mkdtempSync(join(tmpdir(), "llmgw-limits-")), "trace.jsonl");

  beforeAll(async () => {
    [edge, serial, parallel, paced, slow] = await Promise.all([
      startEdgeMiniflare(),
      startSim("serial"),
      // Slow enough (a few ms per token) that admitted requests overlap.
      startSim("parallel", ["--sim-speed", "5", "--sim-trace", trace]),
      startSim("paced"),
      // Real time: a token every ~10 ms.
      startSim("slow", ["--sim-speed", "1"]),
    ]);
    await setEndpoints(edge, [
      { id: "serial", url: serial.url, models: ["serial"] },
      { id: "parallel", url: parallel.url, models: ["parallel"] },
      { id: "paced", url: paced.url, models: ["paced"] },
      { id: "slow", url: slow.url, models: ["slow"] },
    ]);
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  const client = (key: TestKey, maxRetries = 0, fetch?: typeof globalThis.fetch) =>
    new OpenAI({ apiKey: key.secret, baseURL: `${edge.url}/v1`, maxRetries, ...(fetch ? { fetch } : {}) });

  /** The key's ledger, in one read: requests, tokens, and the budget used this period. */
  async function ledger(key: TestKey) {
    const u = (await edge.sync.getUsage({ keyId: key.id })).usage[0]!;
    return {
      requests: Number(u.requests),
      tokens: Number(u.totalTokens),
      budgetUsed: Number(u.budgetUsed),
    };
  }

  /** The ledger once every admitted request's charge has landed. */
  async function charged(key: TestKey, admitted: number) {
    return waitUntil(
      `${admitted} charges`,
      async () => {
        const u = await ledger(key);
        return u.requests === admitted && u;
      },
      10_000,
      20,
    );
  }

  /**
   * Requests one after the other on a fresh key, each sent once the last
   * answer is in; what each got, and the ledger and engine once charged.
   */
  async function backToBack(limits: Parameters<typeof createKey>[1], n: number) {
    const key = await createKey(edge, limits);
    const before = await engineCounters(serial);
    const got: (number | string | null)[] = [];
    for (let i = 0; i < n; i++) {
      const r = await send(client(key), "serial");
      got.push(r.ok ? r.tokens : r.code);
    }
    const usage = await charged(key, got.filter((g) => typeof g === "number").length);
    return { got, usage, engine: delta(before, await engineCounters(serial)) };
  }

  // Three keys each, as the three runs: the hole was a race
  // between a request's charge and the next admission.
  it("budget, back to back: the request that crosses it completes and every later one is refused", async () => {
    for (let run = 0; run < 3; run++) {
      const { got, usage, engine } = await backToBack({ budget: { tokens: 30, period: "1d" } }, 5);
      // 19 (under 30), then 38: the second crosses the budget; nothing after it starts.
      const refused = "insufficient_quota";
      expect(got).toEqual([PER_REQUEST, PER_REQUEST, refused, refused, refused]);
      expect(engine).toEqual({ tokens: 2 * PER_REQUEST, finished: 2 });
      expect(usage.tokens).toBe(engine.tokens);
      expect(usage.budgetUsed).toBe(engine.tokens);
    }
  });

  it("TPM, back to back: the same, refused until the window frees", async () => {
    for (let run = 0; run < 3; run++) {
      const { got, usage, engine } = await backToBack({ tpm: 30 }, 4);
      expect(got).toEqual([PER_REQUEST, PER_REQUEST, "rate_limit_exceeded", "rate_limit_exceeded"]);
      expect(engine).toEqual({ tokens: 2 * PER_REQUEST, finished: 2 });
      expect(usage.tokens).toBe(engine.tokens);
    }
  });

  it("budget, 80 at once: tokens past the budget stay under one request's, nothing starts after the crossing", async () => {
    // Each request reserves its body bytes + max_tokens (about 100 tokens)
    // against 1,000: several run at once far from the budget, one at a
    // time near it.
    const budget = 1_000;
    const n = 80;
    const key = await createKey(edge, { budget: { tokens: budget, period: "1d" } });
    const before = await engineCounters(parallel);
    // The SDK's own retries (Retry-After of a 429 budget_pending: 1 s).
    const results = await Promise.all(Array.from({ length: n }, () => send(client(key, 2), "parallel")));
    const ok = results.filter((r) => r.ok);
    const refused = results.filter((r) => !r.ok);
    expect(refused.every((r) => r.status === 429)).toBe(true);
    expect(new Set(refused.map((r) => r.code))).toEqual(new Set(["insufficient_quota"]));
    const u = await charged(key, ok.length);
    const engine = delta(before, await engineCounters(parallel));
    expect(engine).toEqual({ tokens: ok.length * PER_REQUEST, finished: ok.length });
    expect(u.budgetUsed).toBe(engine.tokens);
    // The budget was reached, and what ran past it is less than one
    // request: every request but the last admitted started while the
    // tokens of all the others (charged or at most their reservation)
    // were under the budget.
    expect(u.budgetUsed).toBeGreaterThanOrEqual(budget);
    expect(u.budgetUsed - budget).toBeLessThan(PER_REQUEST);
    // The engine's view: no request arrived after the requests that had
    // already ended held the budget, and several did run at once.
    const records = await waitUntil(
      "the engine's trace",
      () => {
        const lines = readFileSync(trace, "utf8").trim().split("\n").filter(Boolean);
        return lines.length === ok.length && lines.map((l) => JSON.parse(l) as TraceRecord);
      },
      10_000,
      20,
    );
    const endedBefore = (t: number) =>
      records.filter((r) => r.ended_ms <= t).reduce((s, r) => s + r.prompt_tokens + r.completion_tokens, 0);
    const lastStart = Math.max(...records.map((r) => r.arrived_ms));
    expect(endedBefore(lastStart)).toBeLessThan(budget);
    const together = Math.max(
      ...records.map(
        (a) => records.filter((r) => r.arrived_ms <= a.arrived_ms && a.arrived_ms < r.ended_ms).length,
      ),
    );
    expect(together).toBeGreaterThan(1);
    console.log(
      `budget ${budget}, ${n} at once: admitted ${ok.length}, ${u.budgetUsed - budget} tokens past the budget, up to ${together} running together at the engine; when the last one started, ${endedBefore(lastStart)} tokens had ended`,
    );
  });

  it("budget: a request that could spend the rest and is still running when the wait runs out gets 429 budget_pending", async () => {
    const key = await createKey(edge, { budget: { tokens: 100, period: "1d" } });
    const long = await fetch(`${edge.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key.secret}`, "content-type": "application/json" },
      body: JSON.stringify({ ...ask("slow"), max_tokens: 800, stream: true }),
    });
    expect(long.status).toBe(200);
    const reader = long.body!.getReader();
    await reader.read(); // running: its first token is out
    const seen: Headers[] = [];
    const recording: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      seen.push(res.headers);
      return res;
    };
    // Charged 0, but the running request holds ~600 of 100: the ledger
    // waits for its charge, which does not come within the wait.
    expect(await send(client(key, 0, recording), "slow")).toEqual({
      ok: false,
      status: 429,
      code: "budget_pending",
    });
    expect(seen[0]!.get("retry-after")).toBe("1");
    expect(seen[0]!.get("retry-after-ms")).toBe("1000");
    while (!(await reader.read()).done) {}
    await charged(key, 1);
    // It crossed the budget (9 + 800): now the answer is certain.
    expect(await send(client(key), "slow")).toMatchObject({
      ok: false,
      status: 429,
      code: "insufficient_quota",
    });
    expect((await ledger(key)).budgetUsed).toBe(9 + 800);
  });

  it("RPM: Retry-After is when the window frees, and the openai client's retry then succeeds", async () => {
    const key = await createKey(edge, { rpm: 1 });
    const seen: { status: number; at: number; ms: string | null; s: string | null }[] = [];
    const recording: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      seen.push({
        status: res.status,
        at: Date.now(),
        ms: res.headers.get("retry-after-ms"),
        s: res.headers.get("retry-after"),
      });
      return res;
    };
    const sent1 = Date.now();
    expect(await send(client(key), "paced")).toMatchObject({ ok: true });
    const done1 = Date.now();
    const sent2 = Date.now();
    // One retry: the SDK waits retry-after-ms, then asks again.
    const second = await send(client(key, 1, recording), "paced");
    expect(second).toMatchObject({ ok: true, tokens: PER_REQUEST });
    expect(seen.map((s) => s.status)).toEqual([429, 200]);
    const ms = Number(seen[0]!.ms);
    expect(Number(seen[0]!.s)).toBe(Math.ceil(ms / 1000));
    // The first request was counted in the one-second bucket of its
    // admission (between sent1 and done1), which leaves the window 60 s
    // later; the 429 was decided between sent2 and its arrival here.
    const frees = (t: number) => (Math.floor(t / 1000) + 60) * 1000;
    expect(seen[0]!.at + ms).toBeGreaterThanOrEqual(frees(sent1));
    expect(sent2 + ms).toBeLessThanOrEqual(frees(done1));
    await charged(key, 2);
    console.log(`RPM 1: Retry-After ${seen[0]!.s} s (retry-after-ms ${ms}); the SDK's retry was admitted`);
  }, 120_000);

  it("RPM and TPM: every answer says where the key stands, in OpenAI's x-ratelimit-* headers", async () => {
    const key = await createKey(edge, { rpm: 3, tpm: 1_000 });
    const standing = (h: Headers) => ({
      limit: [h.get("x-ratelimit-limit-requests"), h.get("x-ratelimit-limit-tokens")],
      requests: h.get("x-ratelimit-remaining-requests"),
      tokens: Number(h.get("x-ratelimit-remaining-tokens")),
      reset: [h.get("x-ratelimit-reset-requests"), h.get("x-ratelimit-reset-tokens")],
    });
    const seen: ReturnType<typeof standing>[] = [];
    for (let i = 0; i < 3; i++) {
      const { response } = await client(key).chat.completions.create(ask("serial")).withResponse();
      seen.push(standing(response.headers));
      // The next admission decided on this one's tokens, not its reservation.
      await charged(key, i + 1);
    }
    expect(seen.map((s) => s.limit)).toEqual(Array(3).fill(["3", "1000"]));
    expect(seen.map((s) => s.requests)).toEqual(["2", "1", "0"]);
    // Each saw its own reservation taken (the same for the same request), and what those before it used.
    expect(seen[0]!.tokens).toBeLessThan(1_000);
    expect(seen.map((s) => seen[0]!.tokens - s.tokens)).toEqual([0, PER_REQUEST, 2 * PER_REQUEST]);
    for (const s of seen) for (const r of s.reset) expect(r).toMatch(/^(\d+ms|\d+(\.\d+)?s|1m0s)$/);

    const refused = await client(key)
      .chat.completions.create(ask("serial"))
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const headers = (refused as InstanceType<typeof OpenAI.RateLimitError>).headers;
    expect(standing(headers)).toMatchObject({ requests: "0", limit: ["3", "1000"] });
    // The window empties when the last of the three leaves it, a minute after it came.
    expect(headers.get("x-ratelimit-reset-requests")).toMatch(/^(5\d(\.\d+)?s|1m0s)$/);
    console.log(`RPM 3, TPM 1000: the first answer's standing ${JSON.stringify(seen[0])}`);
  }, 60_000);
});
