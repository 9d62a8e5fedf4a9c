import { createHash } from "node:crypto";
import { describe, expect, it, vi } from "vitest";
import { chatChunks, contentDelta, usageJson } from "../../agent/sim-engine/protocol.ts";
import { usageModeOf } from "../../common/usage-mode.ts";
import { RoutingTable } from "../../edge/catalog.ts";
import { sumCharges } from "../../edge/charge.ts";
import { ChargeBatcher } from "../../edge/charge-batcher.ts";
import { type KeyRecord, keyRecordSchema, modelAllowed, resolveBand } from "../../edge/key-rules.ts";
import { ApiError, normaliseEngineError } from "../../edge/openai-errors.ts";
import {
  ADMIT_WAIT_MS,
  admit,
  budgetPeriodStart,
  type LedgerView,
  PENDING_RETRY_MS,
  reservesTokens,
  SlidingWindow,
  waitBeforeRetry,
} from "../../edge/rate-window.ts";
import {
  estimateTokens,
  OPEN_ENDED_COMPLETION_TOKENS,
  OpenReservations,
  RESERVATION_GRACE_MS,
  reservationFor,
} from "../../edge/reservations.ts";
import { POLL_MS, RevocationWatch } from "../../edge/revocation-watch.ts";
import { sha256Hex } from "../../edge/sha256.ts";
import { SseSplitter, StreamUsage } from "../../edge/sse-usage.ts";
import { PhaseTimeout, tighter, Watchdog, withTimeout } from "../../edge/timeouts.ts";
import { engineUrl, upstreamFor } from "../../edge/upstream.ts";

/** The edge's pure modules, hosted in Node: no Worker needed. */

describe("SSE usage", () => {
  const chunk = (n: number, usage = true) =>
    `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "x" } }], ...(usage ? { usage: { prompt_tokens: 5, completion_tokens: n, total_tokens: 5 + n } } : {}) })}`;
  const final = `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } })}`;

  it("splits events across arbitrary chunk boundaries, CRLF included", () => {
    const s = new SseSplitter();
    const text = `${chunk(1)}\r\n\r\n${chunk(2)}\n\ndata: [DONE]\n\n`;
    const events: string[] = [];
    for (let i = 0; i < text.length; i += 7) events.push(...s.push(text.slice(i, i + 7)));
    expect(events).toHaveLength(3);
    expect(events[2]).toBe("data: [DONE]");
    expect(s.pending()).toBe("");
  });

  it("tracks the last cumulative usage and strips what the client did not ask for", () => {
    const none = new StreamUsage("none");
    expect(none.event(chunk(1))).not.toContain("usage");
    expect(none.event(final)).toBe("");
    expect(none.event("data: [DONE]")).toBe("data: [DONE]\n\n");
    expect(none.usage).toEqual({ prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 });
    expect(none.done).toBe(true);
    expect(none.dataEvents).toBe(1);

    const fin = new StreamUsage("final");
    expect(fin.event(chunk(1))).not.toContain("usage");
    expect(fin.event(final)).toContain('"usage"');

    const all = new StreamUsage("continuous");
    expect(all.event(chunk(1))).toBe(`${chunk(1)}\n\n`);
  });

  it("keeps the last usage that parses when a later usage tail is malformed", () => {
    const t = new StreamUsage("none");
    t.event(chunk(3));
    expect(t.usage?.completion_tokens).toBe(3);
    const broken = chunk(4).replace('"completion_tokens":4', '"completion_tokens":4,,');
    expect(t.event(broken)).not.toContain("usage");
    expect(t.usage?.completion_tokens).toBe(3);
    t.event(chunk(5));
    expect(t.usage?.completion_tokens).toBe(5);
  });

  it("normalises an engine's error event (vLLM int code)", () => {
    const t = new StreamUsage("none");
    const out = t.event(
      'data: {"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}',
    );
    expect(JSON.parse(out.slice(6)).error).toEqual({
      message: "boom",
      type: "server_error",
      param: null,
      code: null,
    });
    expect(t.error?.message).toBe("boom");
  });

  it("derives the usage mode from stream_options", () => {
    expect(usageModeOf(undefined)).toBe("none");
    expect(usageModeOf({ include_usage: true })).toBe("final");
    expect(usageModeOf({ include_usage: true, continuous_usage_stats: true })).toBe("continuous");
    expect(usageModeOf({ continuous_usage_stats: true })).toBe("none");
  });
});

describe("rate windows and admission", () => {
  const limits = { rpm: 2, tpm: 100, budgetTokens: 0, budgetPeriodMs: 0 };
  const view = (v: Partial<LedgerView> = {}): LedgerView => ({
    requests: new SlidingWindow(),
    tokens: new SlidingWindow(),
    budget: { periodStart: 0, used: 0 },
    reserved: 0,
    ...v,
  });
  it("refuses past RPM until the window slides, with a Retry-After", () => {
    const v = view();
    v.requests.add(1_000, 1);
    v.requests.add(30_500, 1);
    const r = admit(limits, v, 31_000);
    expect(r).toMatchObject({ ok: false, reason: "rpm" });
    if (!r.ok && r.reason === "rpm") expect(r.retryAfterMs).toBe(30_000);
    expect(admit(limits, v, 61_000).ok).toBe(true);
  });
  it("says when the window frees enough for one request, to the millisecond of its one-second buckets", () => {
    const v = view();
    v.requests.add(10_250, 1);
    v.requests.add(10_900, 1);
    // Both in the bucket of second 10, which leaves the window at 70 s.
    expect(admit(limits, v, 10_950)).toMatchObject({ reason: "rpm", retryAfterMs: 59_050 });
    expect(admit(limits, v, 69_999)).toMatchObject({ reason: "rpm", retryAfterMs: 1 });
    expect(admit(limits, v, 70_000).ok).toBe(true);
  });
  it("refuses past TPM and past the budget of the current period only", () => {
    const v = view();
    v.tokens.add(0, 150);
    expect(admit(limits, v, 10)).toMatchObject({ reason: "tpm", retryAfterMs: 59_990 });
    const b = { rpm: 0, tpm: 0, budgetTokens: 10, budgetPeriodMs: 86_400_000 };
    const spent = view({ budget: { periodStart: 0, used: 10 } });
    expect(admit(b, spent, 1000)).toMatchObject({ reason: "budget", retryAfterMs: 86_399_000 });
    expect(admit(b, spent, 86_400_001).ok).toBe(true);
    expect(budgetPeriodStart(86_400_001, 86_400_000)).toBe(86_400_000);
  });
  it("admits a budget key while charged plus reserved is under the budget, so only the crossing request runs past it", () => {
    const b = { rpm: 0, tpm: 0, budgetTokens: 30, budgetPeriodMs: 86_400_000 };
    const at = (used: number, reserved: number) =>
      admit(b, view({ budget: { periodStart: 0, used }, reserved }), 1_000);
    expect(at(0, 0).ok).toBe(true);
    // The first request (reserved 29) may not have crossed: the second is admitted.
    expect(at(0, 29).ok).toBe(true);
    // Reservations that could reach the budget: decided once they are charged.
    expect(at(0, 30)).toMatchObject({
      ok: false,
      reason: "pending",
      of: "budget",
      retryAfterMs: PENDING_RETRY_MS,
    });
    expect(at(19, 11)).toMatchObject({ reason: "pending" });
    // Charged 19 of 30, nothing running: the request that will cross starts.
    expect(at(19, 0).ok).toBe(true);
    // Charged 38: spent, whatever is running.
    expect(at(38, 0)).toMatchObject({ reason: "budget" });
    expect(at(38, 500)).toMatchObject({ reason: "budget" });
  });
  it("counts reservations against TPM, and its Retry-After waits for the window to free room beside them", () => {
    const t = { rpm: 0, tpm: 100, budgetTokens: 0, budgetPeriodMs: 0 };
    const v = view({ reserved: 40 });
    v.tokens.add(5_000, 30);
    v.tokens.add(20_000, 40);
    // 70 charged + 40 running ≥ 100: pending; the window frees room for 40 when second 5 leaves it.
    expect(admit(t, v, 21_000)).toMatchObject({
      reason: "pending",
      of: "tpm",
      retryAfterMs: PENDING_RETRY_MS,
    });
    expect(admit(t, v, 64_500)).toMatchObject({ reason: "pending", retryAfterMs: 500 });
    expect(admit(t, v, 65_000).ok).toBe(true);
    v.tokens.add(21_000, 40);
    // 110 charged: refused outright, until 70 − 60 ≤ 100 − 1 − 40: second 20 leaves at 80 s.
    expect(admit(t, v, 22_000)).toMatchObject({ reason: "tpm", retryAfterMs: 58_000 });
  });
  it("holds reservations only for TPM and budget keys", () => {
    expect(reservesTokens({ rpm: 5, tpm: 0, budgetTokens: 0, budgetPeriodMs: 0 })).toBe(false);
    expect(reservesTokens({ rpm: 0, tpm: 5, budgetTokens: 0, budgetPeriodMs: 0 })).toBe(true);
    expect(reservesTokens({ rpm: 0, tpm: 0, budgetTokens: 5, budgetPeriodMs: 1 })).toBe(true);
  });
  it("waits for a pending decision until a reservation closes or expires, its retry time, or the deadline", () => {
    const pending = { ok: false, reason: "pending", of: "budget", retryAfterMs: 1_000, limit: 30 } as const;
    expect(waitBeforeRetry(pending, 0, ADMIT_WAIT_MS, undefined)).toBe(1_000);
    expect(waitBeforeRetry(pending, 0, 300, undefined)).toBe(300);
    expect(waitBeforeRetry(pending, 0, ADMIT_WAIT_MS, 50)).toBe(50);
    expect(waitBeforeRetry(pending, 0, ADMIT_WAIT_MS, -5)).toBe(1);
    expect(waitBeforeRetry(pending, ADMIT_WAIT_MS, ADMIT_WAIT_MS, undefined)).toBeUndefined();
    const spent = { ok: false, reason: "budget", retryAfterMs: 1_000, limit: 30 } as const;
    expect(waitBeforeRetry(spent, 0, ADMIT_WAIT_MS, undefined)).toBeUndefined();
  });
});

describe("reservations", () => {
  it("bounds a request by its body bytes plus n × max_tokens, or assumes OPEN_ENDED_COMPLETION_TOKENS", () => {
    expect(estimateTokens({ max_tokens: 8 }, 100, true)).toBe(108);
    expect(estimateTokens({ max_tokens: 8, n: 3 }, 100, true)).toBe(124);
    expect(estimateTokens({ max_tokens: 8, max_completion_tokens: 20 }, 100, true)).toBe(120);
    expect(estimateTokens({ max_tokens: 30, max_completion_tokens: 20 }, 100, true)).toBe(130);
    expect(estimateTokens({}, 100, true)).toBe(100 + OPEN_ENDED_COMPLETION_TOKENS);
    expect(estimateTokens({ max_tokens: null }, 100, true)).toBe(100 + OPEN_ENDED_COMPLETION_TOKENS);
    // Embeddings: the prompt only.
    expect(estimateTokens({ max_tokens: 8 }, 100, false)).toBe(100);
    expect(reservationFor("req_1", { max_tokens: 8 }, 100, true, 1_800_000)).toEqual({
      id: "req_1",
      tokens: 108,
      ttlMs: 1_800_000 + RESERVATION_GRACE_MS,
    });
  });
  it("keeps the sum of what is open, closes each once, and expires what a dead Worker left", () => {
    const r = new OpenReservations([{ id: "a", tokens: 10, expiresAt: 1_000 }]);
    r.open({ id: "b", tokens: 5, expiresAt: 2_000 });
    r.open({ id: "b", tokens: 7, expiresAt: 2_000 }); // reopened: replaced, not added twice
    expect(r.tokens()).toBe(17);
    expect(r.nextExpiry()).toBe(1_000);
    expect(r.close("a")).toBe(true);
    expect(r.close("a")).toBe(false);
    expect(r.close("never")).toBe(false);
    expect(r.tokens()).toBe(7);
    expect(r.expire(1_999)).toBe(0);
    expect(r.expire(2_000)).toBe(1);
    expect(r.tokens()).toBe(0);
    expect(r.size).toBe(0);
    expect(r.nextExpiry()).toBeUndefined();
  });
});

describe("key rules", () => {
  const bands = [
    { name: "platinum", priority: 400 },
    { name: "gold", priority: 300 },
    { name: "silver", priority: 200 },
    { name: "bronze", priority: 100 },
  ];
  const key = (over: Partial<KeyRecord> = {}): KeyRecord =>
    keyRecordSchema.parse({ id: "k", hash: "a".repeat(64), name: "n", max_band: "gold", ...over });
  it("chooses any band up to the key's, never above", () => {
    expect(resolveBand(key(), null, bands, "gold").name).toBe("gold");
    expect(resolveBand(key(), "silver", bands, "gold").name).toBe("silver");
    expect(() => resolveBand(key(), "platinum", bands, "gold")).toThrow(ApiError);
    expect(() => resolveBand(key(), "nope", bands, "gold")).toThrow(/Unknown band/);
    // A router default above a bronze key is clamped, not refused.
    expect(resolveBand(key({ max_band: "bronze" }), null, bands, "gold").name).toBe("bronze");
    expect(resolveBand(key({ default_band: "silver" }), null, bands, "gold").name).toBe("silver");
    // Settings that dropped the key's band: a 403 that says so, not a 500.
    expect(() => resolveBand(key({ max_band: "diamond" }), null, bands, "gold")).toThrow(
      expect.objectContaining({ status: 403, code: "band_not_configured" }),
    );
  });
  it("limits models by canonical name or alias", () => {
    expect(modelAllowed(key(), "a", "a")).toBe(true);
    expect(modelAllowed(key({ models: ["a"] }), "a", "alias-a")).toBe(true);
    expect(modelAllowed(key({ models: ["alias-a"] }), "a", "alias-a")).toBe(true);
    expect(modelAllowed(key({ models: ["b"] }), "a", "a")).toBe(false);
  });
});

describe("routing table", () => {
  const ep = (id: string, models: string[]) => ({
    id,
    url: "http://x",
    models,
    pool: "default",
    weight: 1,
    priority: 0,
    via: "direct" as const,
  });
  it("knows catalog models, aliases and endpoint-only models, and resolves fallbacks", () => {
    const t = new RoutingTable(
      {
        version: 1,
        models: [
          { name: "big", aliases: ["b"], fallbacks: ["small", "gone"], routing: "" },
          { name: "small", aliases: [], fallbacks: [], routing: "" },
        ],
      },
      { version: 1, endpoints: [ep("e1", ["small"]), ep("e2", ["handrun"])] },
    );
    expect(t.resolve("b")).toBe("big");
    expect(t.resolve("handrun")).toBe("handrun");
    expect(t.resolve("nope")).toBeUndefined();
    expect(t.chain("big")).toEqual(["big", "small"]);
    expect(t.modelNames()).toEqual(["big", "handrun", "small"]);
    expect(t.endpointsFor("small").map((e) => e.id)).toEqual(["e1"]);
  });
});

describe("engine errors", () => {
  it("normalises vLLM, flat and text errors into OpenAI's four fields", () => {
    expect(
      normaliseEngineError(
        400,
        '{"error":{"message":"bad","type":"BadRequestError","param":"max_tokens","code":400}}',
      ),
    ).toEqual({ message: "bad", type: "invalid_request_error", param: "max_tokens", code: null });
    expect(
      normaliseEngineError(404, '{"object":"error","message":"no model","type":"NotFoundError","code":404}'),
    ).toEqual({
      message: "no model",
      type: "invalid_request_error",
      param: null,
      code: null,
    });
    expect(normaliseEngineError(502, "<html>bad gateway</html>")).toMatchObject({
      type: "server_error",
      code: null,
    });
    expect(normaliseEngineError(429, '{"error":{"message":"slow","code":"rate_limit_exceeded"}}').code).toBe(
      "rate_limit_exceeded",
    );
  });
});

describe("timeouts", () => {
  it("rejects with the phase and calls the abort hook", async () => {
    let aborted = false;
    const never = new Promise<never>(() => {});
    const err = await withTimeout(never, 5, "first_token", () => {
      aborted = true;
    }).catch((e) => e);
    expect(err).toBeInstanceOf(PhaseTimeout);
    expect(err.phase).toBe("first_token");
    expect(aborted).toBe(true);
    expect(tighter("idle", 1000, 500, 0)).toEqual([500, "total"]);
    expect(tighter("idle", 100, 500, 0)).toEqual([100, "idle"]);
  });
});

describe("upstream seam", () => {
  const calls: { url: string; headers: Headers }[] = [];
  const direct = async (url: string, init: RequestInit) => {
    calls.push({ url, headers: new Headers(init.headers) });
    return new Response("direct");
  };
  it("direct uses plain fetch", async () => {
    const f = upstreamFor({ id: "e", via: "direct" }, {}, direct);
    expect(await (await f("http://10.0.0.1:8000/v1/x", {})).text()).toBe("direct");
  });
  it("vpc goes through the named VPC network binding with the engine's private URL", async () => {
    const seen: string[] = [];
    const env = {
      LLMGW_VPC_BINDING: "ONPREM",
      ONPREM: {
        fetch: async (input: string | Request) => {
          seen.push(String(input));
          return new Response("vpc");
        },
      },
    };
    const f = upstreamFor({ id: "e", via: "vpc" }, env, direct);
    expect(await (await f("http://10.0.1.50:8000/v1/chat/completions", {})).text()).toBe("vpc");
    expect(seen).toEqual(["http://10.0.1.50:8000/v1/chat/completions"]);
    await expect(upstreamFor({ id: "e", via: "vpc" }, {}, direct)("http://x", {})).rejects.toThrow(
      /no "ONPREM"/,
    );
  });
  it("tunnel adds the Access service-token headers", async () => {
    calls.length = 0;
    const f = upstreamFor(
      { id: "e", via: "tunnel" },
      { CF_ACCESS_CLIENT_ID: "id.access", CF_ACCESS_CLIENT_SECRET: "s3cret" },
      direct,
    );
    await f("https://vllm-a.example.com/v1/x", { headers: { "content-type": "application/json" } });
    expect(calls[0]!.headers.get("cf-access-client-id")).toBe("id.access");
    expect(calls[0]!.headers.get("cf-access-client-secret")).toBe("s3cret");
    expect(calls[0]!.headers.get("content-type")).toBe("application/json");
    await expect(upstreamFor({ id: "e", via: "tunnel" }, {}, direct)("http://x", {})).rejects.toThrow(
      /CF_ACCESS/,
    );
  });
  it("joins endpoint URLs with or without /v1", () => {
    expect(engineUrl("http://h:1", "/v1/completions")).toBe("http://h:1/v1/completions");
    expect(engineUrl("http://h:1/v1/", "/v1/completions")).toBe("http://h:1/v1/completions");
  });
});

describe("SSE fast path", () => {
  // The substring fast path must give exactly what the JSON round trip gives.
  const chunks = [
    '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0}}',
    '{"id":"c","choices":[{"index":0,"delta":{"content":" \\"usage\\": {}"}}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}',
    '{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}',
    '{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}}',
    '{"id":"c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}',
    '{"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}',
  ];
  it.each(["none", "final", "continuous"] as const)("matches the general path in mode %s", (mode) => {
    const t = new StreamUsage(mode);
    for (const c of chunks) {
      const out = t.event(`data: ${c}`);
      const obj = JSON.parse(c);
      const usageOnly = Array.isArray(obj.choices) && obj.choices.length === 0 && obj.usage;
      if (mode === "continuous") expect(out).toBe(`data: ${c}\n\n`);
      else if (usageOnly) expect(out).toBe(mode === "final" ? `data: ${c}\n\n` : "");
      else {
        delete obj.usage;
        expect(JSON.parse(out.slice(6))).toEqual(obj);
      }
    }
    expect(t.usage).toEqual({ prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 });
    expect(t.dataEvents).toBe(4);
  });
});

describe("SSE chunk fast path (bytes)", () => {
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  // What the sim (and vLLM) writes for one chat stream with continuous usage.
  const w = chatChunks("chatcmpl-1", 1, "m", "continuous");
  const u = (c: number, details = false) => usageJson({ prompt: 9, completion: c, cached: 4 }, details);
  const role = w.role(0, u(0));
  const first = w.token(0, contentDelta("Hé"), null, null, u(1));
  const engine = [
    role,
    first,
    w.token(0, contentDelta(' "usage":{}'), null, null, u(2)), // the key's text inside content, escaped
    w.token(0, contentDelta("x"), null, null, null), // usage null
    w.token(0, contentDelta("ü"), null, "stop", u(3, true)), // nested prompt_tokens_details
    w.usage(u(3, true)),
  ];

  it.each(["none", "final", "continuous"] as const)("gives what the text path gives, mode %s", (mode) => {
    const bytes = new StreamUsage(mode);
    const text = new StreamUsage(mode);
    for (const c of engine) {
      const want = text.event(c.slice(0, -2));
      const got = bytes.chunk(enc.encode(c));
      expect(got, c).toBeDefined();
      expect(dec.decode(got)).toBe(want);
    }
    expect(bytes.usage).toEqual(text.usage);
    expect(bytes.usage).toEqual({ prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 });
    expect(bytes.dataEvents).toBe(text.dataEvents);
    expect(bytes.dataEvents).toBe(5);
  });

  it.each([
    ["two events in one chunk", `${role}${first}`],
    ["an event cut short", first.slice(0, -1)],
    ["CRLF line ends", first.replace("\n\n", "\r\n\r\n")],
    ["no usage key", 'data: {"choices":[{"index":0}]}\n\n'],
    ["usage not last after choices", 'data: {"choices":[{"index":0}],"x":1,"usage":{"prompt_tokens":1}}\n\n'],
    ["usage not an object", 'data: {"choices":[{"index":0}],"usage":7}\n\n'],
    ["empty choices, null usage", 'data: {"choices":[],"usage":null}\n\n'],
    ["[DONE]", "data: [DONE]\n\n"],
    ["an error event", 'data: {"error":{"message":"boom","code":500}}\n\n'],
    ["no space after data:", first.replace("data: ", "data:")],
  ])("leaves %s to the text path", (_name, c) => {
    const t = new StreamUsage("none");
    expect(t.chunk(enc.encode(c))).toBeUndefined();
    expect(t.dataEvents).toBe(0);
    expect(t.usage).toBeUndefined();
  });

  it("cuts the usage off in place, leaving one event", () => {
    const b = enc.encode(first);
    const out = new StreamUsage("none").chunk(b)!;
    expect(out.buffer).toBe(b.buffer);
    expect(dec.decode(out)).toMatch(/^data: \{.*"finish_reason":null\}\]\}\n\n$/);
  });
});

describe("sha256Hex", () => {
  it("matches node:crypto on FIPS vectors, multi-byte text and every length across the block edges", () => {
    const texts = ["", "abc", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "é€𝄞".repeat(30)];
    for (let n = 0; n < 200; n++) texts.push("k".repeat(n));
    for (const t of texts)
      expect(sha256Hex(t), `${t.length} chars`).toBe(createHash("sha256").update(t).digest("hex"));
    expect(sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });
});

describe("sumCharges", () => {
  it("sums a batch and counts partial answers", () => {
    const c = (p: number, k: number, partial = false) => ({
      prompt_tokens: p,
      completion_tokens: k,
      partial,
    });
    expect(sumCharges("b1", [c(10, 5), c(7, 2, true), c(-3, 1.7)])).toEqual({
      id: "b1",
      requests: 3,
      prompt_tokens: 17,
      completion_tokens: 8,
      partial_requests: 1,
      closes: [],
    });
  });
  it("names the reservations its requests held", () => {
    const c = (reservation?: string) => ({
      prompt_tokens: 1,
      completion_tokens: 1,
      partial: false,
      reservation,
    });
    expect(sumCharges("b2", [c("req_a"), c(), c("req_b")]).closes).toEqual(["req_a", "req_b"]);
  });
});

describe("ChargeBatcher", () => {
  it("groups charges per key into one flush, and each caller waits for its batch", async () => {
    const flushed: [string, number[]][] = [];
    const b = new ChargeBatcher<number>(async (k, items) => {
      flushed.push([k, [...items]]);
    }, 5);
    await Promise.all([b.add("a", 1), b.add("a", 2), b.add("b", 3), b.add("a", 4)]);
    expect(flushed).toEqual([
      ["a", [1, 2, 4]],
      ["b", [3]],
    ]);
  });
  it("retries a failed flush once with the same batch id, then rejects", async () => {
    const ids: string[] = [];
    let n = 0;
    const ok = new ChargeBatcher<number>(
      async (_k, _items, id) => {
        ids.push(id);
        if (ids.length === 1) throw new Error("blip");
      },
      1,
      200,
      () => `batch-${++n}`,
    );
    await ok.add("a", 1);
    expect(ids).toEqual(["batch-1", "batch-1"]);
    await ok.add("a", 2);
    expect(ids.at(-1)).toBe("batch-2");
    const bad = new ChargeBatcher<number>(async () => {
      throw new Error("down");
    }, 1);
    await expect(bad.add("a", 1)).rejects.toThrow("down");
  });
});

describe("RevocationWatch", () => {
  it("polls at most every POLL_MS and accumulates revoked ids by epoch", async () => {
    let now = 0;
    const w = new RevocationWatch(() => now);
    const asked: number[] = [];
    const log = [
      { epoch: 1, id: "k1" },
      { epoch: 2, id: "k2" },
    ];
    const since = async (e: number) => {
      asked.push(e);
      const rows = log.filter((r) => r.epoch > e);
      return { epoch: rows.at(-1)?.epoch ?? e, ids: rows.map((r) => r.id) };
    };
    await w.refresh(since);
    expect(w.isRevoked("k2")).toBe(true);
    log.push({ epoch: 3, id: "k3" });
    now = POLL_MS - 1;
    expect(w.due()).toBe(false);
    await w.refresh(since);
    expect(w.isRevoked("k3")).toBe(false);
    now = POLL_MS;
    expect(w.due()).toBe(true);
    const polling = w.refresh(since);
    expect(w.due()).toBe(false); // one poll at a time
    await polling;
    expect(w.isRevoked("k3")).toBe(true);
    expect(asked).toEqual([0, 2]);
  });
});

describe("Watchdog", () => {
  it("fires for the phase whose limit passes without activity, once", async () => {
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 10_000, (t) => fired.push(t.phase));
    w.arm("first_token", 30);
    await new Promise((r) => setTimeout(r, 15));
    w.arm("idle", 40);
    for (let i = 0; i < 4; i++) {
      await new Promise((r) => setTimeout(r, 15));
      w.touch();
    }
    expect(fired).toEqual([]);
    await new Promise((r) => setTimeout(r, 80));
    expect(fired).toEqual(["idle"]);
    w.stop();
  });
  it("keeps one timer for phases armed to later deadlines, and still fires on time", async () => {
    const spy = vi.spyOn(globalThis, "setTimeout");
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 10_000, (t) => fired.push(t.phase), Date.now, 30);
    w.arm("response_header", 200);
    w.arm("first_token", 300);
    w.arm("idle", 40);
    expect(spy.mock.calls.length).toBe(1);
    spy.mockRestore();
    await new Promise((r) => setTimeout(r, 150));
    expect(fired).toEqual(["idle"]);
    w.stop();
  });
  it("moves the check forward when a phase ends sooner than the pending check", async () => {
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 10_000, (t) => fired.push(t.phase));
    w.arm("first_token", 5_000);
    w.arm("idle", 30);
    await new Promise((r) => setTimeout(r, 100));
    expect(fired).toEqual(["idle"]);
    w.stop();
  });
  it("fires total when the overall deadline comes first", async () => {
    const fired: string[] = [];
    const w = new Watchdog(Date.now() + 20, (t) => fired.push(t.phase));
    w.arm("idle", 1000);
    await new Promise((r) => setTimeout(r, 50));
    expect(fired).toEqual(["total"]);
  });
});
