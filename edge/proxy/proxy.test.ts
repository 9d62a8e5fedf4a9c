import { describe, expect, it, vi } from "vitest";
import { routerSchema } from "../config/router.ts";
import { ClientGone, type PoolLease } from "../pool/client.ts";
import { promptTokens } from "../routing/demand.ts";
import { plainEndpoint } from "../routing/plain-endpoint.ts";
import type { Verdict } from "../routing/pool-core.ts";
import type { EndpointSpec } from "../routing/types.ts";
import type { Target } from "./attempt-plan.ts";
import { type Outcome, type ProxyInput, proxy } from "./proxy.ts";
import type { UpstreamFetch } from "./upstream.ts";

/**
 * The proxy in Node against fake engines at its UpstreamFetch seam: retries
 * before the first byte, the verdict every attempt reports to its lease,
 * usage on both paths, failures mid-stream. No workerd, no pool.
 */
const settingsInput = {
  retries: 2,
  timeouts: { response_header: "200ms", first_token: "200ms", idle: "200ms", total: "5s" },
};
const settings = routerSchema.parse(settingsInput);

const ep = (id: string): EndpointSpec => plainEndpoint(id, { url: `http://${id}.test` });

function fakeLease(verdicts: [string, Verdict][]): PoolLease {
  return {
    lease: {
      id: "req_1",
      endpoint: ep("a"),
      alternates: [],
      route: "prefix",
      band: "gold",
      queuedMs: 12.4,
      saturation: 0.3,
    },
    model: "m",
    failOpen: false,
    prefilled: () => {},
    record: (endpoint, verdict) => verdicts.push([endpoint, verdict]),
    settle: () => Promise.resolve(),
  };
}

function targets(ids: string[], lease: PoolLease) {
  const queue: Target[] = ids.map((id) => ({ model: "m", endpoint: ep(id), lease }));
  return { take: async () => queue.shift() };
}

const encoder = new TextEncoder();

/** A streamed answer; like fetch's, its body errors when the request's signal aborts. */
function sse(
  chunks: string[],
  opts: {
    endEarly?: boolean;
    stallAfter?: number;
    signal?: AbortSignal | null | undefined;
    /** What became of the body: read to its end, or cancelled by the reader. */
    fate?: { ended: boolean; cancelled: boolean };
  } = {},
): Response {
  let i = 0;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      opts.signal?.addEventListener("abort", () => c.error(new DOMException("aborted", "AbortError")));
    },
    pull(c) {
      if (opts.stallAfter !== undefined && i >= opts.stallAfter) return new Promise(() => {});
      if (i < chunks.length) c.enqueue(encoder.encode(chunks[i++]!));
      else if (opts.endEarly) c.error(new Error("connection reset"));
      else {
        c.close();
        if (opts.fate) opts.fate.ended = true;
      }
      return undefined;
    },
    cancel() {
      if (opts.fate) opts.fate.cancelled = true;
    },
  });
  return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
}

const chunk = (content: string, completion: number) =>
  `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"${content}"},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":${completion},"total_tokens":${5 + completion}}}\n\n`;
const usageChunk =
  'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n';

function run(
  upstream: Record<string, (init: RequestInit) => Response | Promise<Response>>,
  ids: string[],
  extra: Partial<ProxyInput> = {},
) {
  const verdicts: [string, Verdict][] = [];
  const lease = fakeLease(verdicts);
  const calls: string[] = [];
  const input: ProxyInput = {
    requestId: "req_1",
    apiPath: "/v1/chat/completions",
    body: { model: "m", messages: [{ role: "user", content: "hi" }] },
    stream: false,
    settings,
    band: "gold",
    targets: targets(ids, lease),
    upstream: (e) =>
      ((url: string, init: RequestInit) => {
        calls.push(url);
        const f = upstream[e.id];
        if (!f) return Promise.reject(new TypeError("connection refused"));
        return Promise.resolve(f(init));
      }) as UpstreamFetch,
    pipe: () => new TransformStream<Uint8Array, Uint8Array>(),
    promptTokens: 0,
    ...extra,
  };
  // As the edge estimates it from the body admission read.
  input.promptTokens = extra.promptTokens ?? promptTokens(input.body);
  return { result: proxy(input), verdicts, calls };
}

describe("proxy", () => {
  it("answers a non-streamed request, with its routing headers and usage, and reports ok", async () => {
    const body = { id: "x", choices: [], usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 } };
    const { result, verdicts, calls } = run({ a: () => Response.json(body) }, ["a"]);
    const r = await result;
    expect(r.response.status).toBe(200);
    expect(Object.fromEntries(r.response.headers)).toMatchObject({
      "x-llmgw-endpoint": "a",
      "x-llmgw-attempts": "1",
      "x-llmgw-route": "prefix",
      "x-llmgw-admitted": "pool",
      "x-llmgw-queued-ms": "12",
      "x-llmgw-band": "gold",
    });
    expect((await r.outcome).usage).toEqual({ prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 });
    expect(calls).toEqual(["http://a.test/v1/chat/completions"]);
    expect(verdicts).toEqual([["a", "ok"]]);
  });

  it("relays an engine's 200 whose body is JSON but no object as it came, charged from the prompt's estimate", async () => {
    const { result, verdicts } = run({ a: () => Response.json(null) }, ["a"]);
    const r = await result;
    expect([r.response.status, await r.response.text()]).toEqual([200, "null"]);
    const o = await r.outcome;
    expect(o.usageEstimated).toBe(true);
    expect(o.usage!.prompt_tokens).toBeGreaterThan(0);
    expect(verdicts).toEqual([["a", "ok"]]);
  });

  it("retries a refused connection and a 503 on the next endpoints, reporting each failure", async () => {
    const { result, verdicts } = run(
      {
        b: () => new Response('{"error":{"message":"busy"}}', { status: 503 }),
        c: () =>
          Response.json({ choices: [], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }),
      },
      ["a", "b", "c"],
    );
    const r = await result;
    expect(r.response.status).toBe(200);
    expect(r.response.headers.get("x-llmgw-attempts")).toBe("3");
    await r.outcome;
    expect(verdicts).toEqual([
      ["a", "fail"],
      ["b", "fail"],
      ["c", "ok"],
    ]);
  });

  it("sends a request whose connection was lost once more to the same engine, on the same attempt", async () => {
    let sends = 0;
    const { result, verdicts, calls } = run(
      {
        a: () => {
          // The engine closed its idle connection as the request went out on it.
          if (++sends === 1) throw new TypeError("Network connection lost.");
          return Response.json({
            choices: [],
            usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
          });
        },
      },
      ["a", "b"],
    );
    const r = await result;
    expect(r.response.status).toBe(200);
    expect(r.response.headers.get("x-llmgw-attempts")).toBe("1");
    await r.outcome;
    expect(calls).toEqual(["http://a.test/v1/chat/completions", "http://a.test/v1/chat/completions"]);
    expect(verdicts).toEqual([["a", "ok"]]);
  });

  it("does not resend a send that failed a while after it went out: that connection was carrying work", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      const { result, calls, verdicts } = run(
        {
          a: () => {
            // Lost 2 s into a non-streamed answer's generation.
            vi.setSystemTime(Date.now() + 2_000);
            throw new TypeError("Network connection lost.");
          },
          b: () =>
            Response.json({
              choices: [],
              usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
            }),
        },
        ["a", "b"],
      );
      const r = await result;
      expect(r.response.headers.get("x-llmgw-attempts")).toBe("2");
      await r.outcome;
      expect(calls.map((u) => new URL(u).host)).toEqual(["a.test", "b.test"]);
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "ok"],
      ]);
    } finally {
      vi.useRealTimers();
    }
  });

  it("does not resend when the client left", async () => {
    const client = new AbortController();
    const { result, calls } = run(
      {
        a: () => {
          client.abort();
          throw new TypeError("Network connection lost.");
        },
      },
      ["a", "b"],
      { stream: true, clientSignal: client.signal },
    );
    const r = await result;
    await r.outcome;
    expect(calls.map((u) => new URL(u).host)).toEqual(["a.test"]);
  });

  it("counts a connection lost twice as the attempt's failure, and never resends after a timeout", async () => {
    const { result, verdicts, calls } = run(
      {
        // Headers that never come: first_token (200 ms) aborts the attempt.
        b: (init) =>
          new Promise<Response>((_, reject) =>
            init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))),
          ),
        c: () => sse([chunk("ok", 1), "data: [DONE]\n\n"]),
      },
      ["a", "b", "c"],
      { stream: true, settings: routerSchema.parse({ ...settingsInput, stream_commit: "first_token" }) },
    );
    const r = await result;
    expect(r.response.headers.get("x-llmgw-attempts")).toBe("3");
    expect(await r.response.text()).toContain("data: [DONE]");
    await r.outcome;
    expect(calls.map((u) => new URL(u).host)).toEqual(["a.test", "a.test", "b.test", "c.test"]);
    expect(verdicts.map(([e, v]) => `${e} ${v}`)).toEqual(["a fail", "b fail", "c ok"]);
  });

  it("relays a Responses API stream as it came, adds no [DONE], and takes its usage from response.completed", async () => {
    const ev = (type: string, fields: Record<string, unknown>) =>
      `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
    const events = [
      ev("response.created", { response: { id: "resp_1", status: "in_progress", usage: null } }),
      ev("response.output_text.delta", { item_id: "msg_1", delta: "Hi" }),
      ev("response.completed", {
        response: {
          id: "resp_1",
          status: "completed",
          usage: { input_tokens: 4, output_tokens: 1, total_tokens: 5 },
        },
      }),
    ];
    let sent: Record<string, unknown> = {};
    const { result } = run(
      {
        a: (init) => {
          sent = JSON.parse(String(init.body)) as Record<string, unknown>;
          return sse(events);
        },
      },
      ["a"],
      {
        apiPath: "/v1/responses",
        stream: true,
        body: { model: "m", input: "hi", stream: true },
      },
    );
    const r = await result;
    expect(await r.response.text()).toBe(events.join(""));
    const o = await r.outcome;
    expect(o.usage).toEqual({ prompt_tokens: 4, completion_tokens: 1, total_tokens: 5 });
    expect(o.usageEstimated).toBe(false);
    // Nothing to ask for: a Responses stream always ends with its usage.
    expect(sent.stream_options).toBeUndefined();
  });

  it("charges a non-streamed response what its usage says, in the Responses API's names", async () => {
    const body = { id: "resp_1", output: [], usage: { input_tokens: 7, output_tokens: 2, total_tokens: 9 } };
    const { result } = run({ a: () => Response.json(body) }, ["a"], {
      apiPath: "/v1/responses",
      body: { model: "m", input: "hi" },
    });
    const r = await result;
    expect(await r.response.json()).toEqual(body);
    expect((await r.outcome).usage).toEqual({ prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 });
  });

  it("returns an engine's 4xx at once, normalised, without a retry: the engine is alive", async () => {
    const { result, verdicts, calls } = run(
      {
        a: () =>
          new Response(
            '{"error":{"message":"too long","type":"BadRequestError","param":"messages","code":400}}',
            {
              status: 400,
            },
          ),
      },
      ["a", "b"],
    );
    const r = await result;
    expect(r.response.status).toBe(400);
    expect(await r.response.json()).toEqual({
      error: { message: "too long", type: "invalid_request_error", param: "messages", code: null },
    });
    expect(calls).toHaveLength(1);
    expect(verdicts).toEqual([["a", "ok"]]);
  });

  describe("an engine that refuses the edge's key (401, 403)", () => {
    const unauthorized = () => new Response('{"error":"Unauthorized"}', { status: 401 });
    const forbidden = () => new Response("<html><title>Forbidden</title></html>", { status: 403 });
    const answer = () =>
      Response.json({ choices: [], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });

    it("is that endpoint's failure: the next endpoint serves, and the breaker hears it", async () => {
      const { result, verdicts, calls } = run({ a: unauthorized, b: forbidden, c: answer }, ["a", "b", "c"]);
      const r = await result;
      expect(r.response.status).toBe(200);
      expect(r.response.headers.get("x-llmgw-attempts")).toBe("3");
      expect(calls).toHaveLength(3);
      await r.outcome;
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "fail"],
        ["c", "ok"],
      ]);
    });

    it("with none left, the client gets a 502 upstream_unauthorized naming the endpoint, never a 401", async () => {
      const { result, verdicts } = run({ a: unauthorized, b: unauthorized }, ["a", "b"]);
      const r = await result;
      expect(r.response.status).toBe(502);
      const body = (await r.response.json()) as { error: Record<string, unknown> };
      expect(body.error).toMatchObject({ type: "server_error", code: "upstream_unauthorized", param: null });
      expect(body.error.message).toMatch(/^The engine \(b\) refused the edge's key \(HTTP 401\)/);
      expect(r.response.headers.get("retry-after")).toBeNull();
      expect(await r.outcome).toMatchObject({ status: 502, errorCode: "upstream_unauthorized", attempts: 2 });
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "fail"],
      ]);
    });

    it.each(["headers", "first_token"] as const)(
      "a stream (committed at %s) is retried before any 200, or refused with the 502",
      async (commit) => {
        const stream = { stream: true, settings: committedAt(commit) };
        const served = run(
          { a: unauthorized, b: () => sse([chunk("ok", 1), "data: [DONE]\n\n"]) },
          ["a", "b"],
          stream,
        );
        const r = await served.result;
        expect(r.response.status).toBe(200);
        expect(r.response.headers.get("x-llmgw-endpoint")).toBe("b");
        expect(await r.response.text()).toContain('"content":"ok"');
        await r.outcome;
        expect(served.verdicts).toEqual([
          ["a", "fail"],
          ["b", "ok"],
        ]);
        const refused = await run({ a: forbidden }, ["a"], stream).result;
        expect(refused.response.status).toBe(502);
        expect(((await refused.response.json()) as { error: { code: string } }).error.code).toBe(
          "upstream_unauthorized",
        );
      },
    );
  });

  it("after the last endpoint, answers with the last failure", async () => {
    const { result, verdicts } = run({}, ["a", "b"]);
    const r = await result;
    expect(r.response.status).toBe(503);
    expect(((await r.response.json()) as { error: { code: string } }).error.code).toBe(
      "upstream_unreachable",
    );
    expect(r.response.headers.get("x-llmgw-attempts")).toBe("2");
    expect(verdicts).toEqual([
      ["a", "fail"],
      ["b", "fail"],
    ]);
  });

  it("reads an answer to its body's end after [DONE], and gives up on one that never ends", async () => {
    // The runtime gives a connection back to its pool only once its response was read to the end.
    const chunks = [chunk("Hi", 1), usageChunk, "data: [DONE]\n\n"];
    const ending = { ended: false, cancelled: false };
    const stalled = { ended: false, cancelled: false };
    for (const [fate, stallAfter] of [
      [ending, undefined],
      [stalled, chunks.length],
    ] as const) {
      const { result } = run({ a: () => sse(chunks, { stallAfter, fate }) }, ["a"], { stream: true });
      const r = await result;
      expect((await r.response.text()).trim().endsWith("data: [DONE]")).toBe(true);
      expect((await r.outcome).completed).toBe(true);
    }
    expect(ending).toEqual({ ended: true, cancelled: false });
    expect(stalled).toEqual({ ended: false, cancelled: true });
  });

  it("streams, cutting the injected usage back to what the client asked for (nothing)", async () => {
    const { result, verdicts } = run(
      { a: () => sse([chunk("Hel", 1), chunk("lo", 2), usageChunk, "data: [DONE]\n\n"]) },
      ["a"],
      { stream: true },
    );
    const r = await result;
    const text = await r.response.text();
    expect(text).not.toContain("usage");
    expect(text).toContain('"content":"Hel"');
    expect(text.trim().endsWith("data: [DONE]")).toBe(true);
    const o = await r.outcome;
    expect(o.usage?.completion_tokens).toBe(2);
    expect(o.completed).toBe(true);
    expect(verdicts).toEqual([["a", "ok"]]);
  });

  /** Settings with the client's response committed at the engine's headers or at the first token. */
  const committedAt = (stream_commit: "headers" | "first_token", over: Record<string, unknown> = {}) =>
    routerSchema.parse({ ...settingsInput, ...over, stream_commit });

  describe.each(["headers", "first_token"] as const)("a stream committed at %s", (commit) => {
    it("that closes before its first token is retried elsewhere, the client none the wiser", async () => {
      const { result, verdicts } = run(
        {
          a: () => sse([], { endEarly: true }),
          b: () => sse([chunk("ok", 1), "data: [DONE]\n\n"]),
        },
        ["a", "b"],
        { stream: true, settings: committedAt(commit) },
      );
      const r = await result;
      expect(r.response.status).toBe(200);
      // The headers are the attempt's the client's response began with.
      expect(r.response.headers.get("x-llmgw-endpoint")).toBe(commit === "headers" ? "a" : "b");
      const text = await r.response.text();
      expect(text).toContain('"content":"ok"');
      expect(text).toContain("data: [DONE]");
      expect(await r.outcome).toMatchObject({
        endpointId: "b",
        attempts: 2,
        completed: true,
        errorCode: null,
      });
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "ok"],
      ]);
    });

    it("reports when its first token went out, which the access log's ttft_ms is", async () => {
      // The clock is the test's: it moves only when told, between the headers and the token.
      vi.useFakeTimers({ toFake: ["Date"] });
      try {
        let release!: () => void;
        const token = new Promise<void>((r) => {
          release = r;
        });
        // Headers at once, the first token when the test releases it.
        const gated = () =>
          new Response(
            new ReadableStream<Uint8Array>({
              async start(c) {
                await token;
                c.enqueue(encoder.encode(chunk("ok", 1)));
                c.enqueue(encoder.encode("data: [DONE]\n\n"));
                c.close();
              },
            }),
            { status: 200, headers: { "content-type": "text/event-stream" } },
          );
        // Committed at the first token, there is no response before it.
        if (commit === "first_token") release();
        const { result } = run({ a: gated }, ["a"], { stream: true, settings: committedAt(commit) });
        const r = await result;
        const responded = Date.now();
        vi.setSystemTime(responded + 60);
        release();
        await r.response.text();
        const o = await r.outcome;
        // Committed at the headers, the token went out after the response; at the first token, with it.
        expect(o.firstByteAt! - responded).toBe(commit === "headers" ? 60 : 0);
      } finally {
        vi.useRealTimers();
      }
    });

    it("that fails before its first token everywhere tells the client the last failure", async () => {
      const { result, verdicts } = run(
        { a: () => sse([], { endEarly: true }), b: () => sse([], { endEarly: true }) },
        ["a", "b"],
        { stream: true, settings: committedAt(commit) },
      );
      const r = await result;
      const o = await r.outcome;
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "fail"],
      ]);
      expect(o).toMatchObject({ attempts: 2, completed: false, errorCode: "upstream_error" });
      if (commit === "first_token") {
        expect([r.response.status, o.status]).toEqual([503, 503]);
        expect(((await r.response.json()) as { error: { code: string } }).error.code).toBe("upstream_error");
        return;
      }
      // Committed: one error event, in OpenAI's shape, and the stream's end.
      expect([r.response.status, o.status]).toEqual([200, 200]);
      const events = (await r.response.text()).split("\n\n").filter(Boolean);
      expect(events).toHaveLength(1);
      const error = JSON.parse(events[0]!.slice("data: ".length)).error;
      expect(error).toMatchObject({ code: "upstream_error", type: "service_unavailable_error" });
      expect(error.message).toMatch(/^The engine \(b\) failed before the first token/);
    });

    it("retries an engine's own error event before the first token, and passes the last one on", async () => {
      // As SGLang and others send a failure once their stream has begun: a 200, one error event, the end.
      const erring = (message: string) => () =>
        sse([`data: {"error":{"message":"${message}","type":"InternalServerError","code":500}}\n\n`]);
      const { result, verdicts } = run(
        { a: erring("a is out of memory"), b: erring("b is out of memory") },
        ["a", "b"],
        {
          stream: true,
          settings: committedAt(commit),
        },
      );
      const r = await result;
      const text = await r.response.text();
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "fail"],
      ]);
      expect(text).toContain("b is out of memory");
      expect(text).not.toContain("a is out of memory");
      expect(r.response.status).toBe(commit === "headers" ? 200 : 500);
      expect((await r.outcome).completed).toBe(false);
    });

    it("stops at an engine's 4xx on the way: the engine is alive, the caller asked wrong", async () => {
      const bad = () =>
        Response.json({ error: { message: "prompt too long", type: "BadRequestError" } }, { status: 400 });
      const { result, verdicts, calls } = run(
        { a: () => sse([], { endEarly: true }), b: bad, c: () => sse([chunk("ok", 1), "data: [DONE]\n\n"]) },
        ["a", "b", "c"],
        { stream: true, settings: committedAt(commit) },
      );
      const r = await result;
      const text = await r.response.text();
      expect(text).toContain("prompt too long");
      expect(calls).toHaveLength(2);
      expect(await r.outcome).toMatchObject({ status: commit === "headers" ? 200 : 400, completed: false });
      expect(verdicts).toEqual([
        ["a", "fail"],
        ["b", "ok"],
      ]);
    });
  });

  it.each([
    ["the client left while a fallback's pool queued it", new ClientGone(), "client_closed"],
    ["the edge failed asking a fallback's pool", new Error("boom"), "internal_error"],
  ])("a stream committed at its headers still ends when %s", async (_, thrown, code) => {
    const verdicts: [string, Verdict][] = [];
    const lease = fakeLease(verdicts);
    let taken = 0;
    const { result } = run({ a: () => sse([], { endEarly: true }) }, [], {
      stream: true,
      targets: {
        take: async () => {
          if (taken++ === 0) return { model: "m", endpoint: ep("a"), lease };
          throw thrown;
        },
      },
    });
    const logged = vi.spyOn(console, "error").mockImplementation(() => {});
    const r = await result;
    const text = await r.response.text();
    const o = await r.outcome;
    const errorsLogged = logged.mock.calls.map((c) => c[2]);
    logged.mockRestore();
    expect(o).toMatchObject({ status: 200, errorCode: code, attempts: 1 });
    if (code === "internal_error") {
      // The client gets the request id; the Worker's log, the error.
      expect(text).toContain('"code":"internal_error"');
      expect(errorsLogged).toEqual([thrown]);
    } else expect(text).toBe("");
    expect(verdicts).toEqual([["a", "fail"]]);
  });

  it("a stream that breaks after its first token ends with an SSE error event and reports a failure", async () => {
    const { result, verdicts } = run({ a: () => sse([chunk("Hel", 1)], { endEarly: true }) }, ["a", "b"], {
      stream: true,
    });
    const r = await result;
    const text = await r.response.text();
    expect(text).toContain('"code":"upstream_disconnected"');
    const o = await r.outcome;
    expect([o.completed, o.usage?.completion_tokens]).toEqual([false, 1]);
    expect(verdicts).toEqual([["a", "fail"]]);
  });

  it("a stream that goes silent mid-way is cut off after idle", async () => {
    const { result, verdicts } = run(
      { a: (init) => sse([chunk("Hel", 1), chunk("lo", 2)], { stallAfter: 2, signal: init.signal }) },
      ["a"],
      {
        stream: true,
      },
    );
    const r = await result;
    expect(await r.response.text()).toContain('"code":"idle_timeout"');
    expect(verdicts).toEqual([["a", "fail"]]);
  });

  /** An engine that takes the request and never answers, as a frozen (SIGSTOP) one does: fetch settles only on abort. */
  const frozen = (init: RequestInit) =>
    new Promise<Response>((_, reject) =>
      init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))),
    );

  const streamedTo = (timeouts: Record<string, string>, ids: string[], extra: Partial<ProxyInput> = {}) =>
    run({ a: frozen, b: () => sse([chunk("ok", 1), "data: [DONE]\n\n"]) }, ids, {
      stream: true,
      settings: routerSchema.parse({ retries: 2, timeouts: { total: "5s", ...timeouts } }),
      ...extra,
    });

  it.each(["headers", "first_token"] as const)(
    "a client gone before the first token aborts the engine's request at once, tries no other, and blames none (committed at %s)",
    async (commit) => {
      const client = new AbortController();
      // Headers, then nothing: the engine holds its first token back.
      const silent = (init: RequestInit) => sse([], { stallAfter: 0, signal: init.signal });
      let aborted = false;
      const { result, verdicts, calls } = run(
        {
          a: (init) => {
            init.signal?.addEventListener("abort", () => {
              aborted = true;
            });
            queueMicrotask(() => client.abort());
            return silent(init);
          },
          b: silent,
        },
        ["a", "b"],
        {
          stream: true,
          clientSignal: client.signal,
          settings: routerSchema.parse({
            retries: 2,
            stream_commit: commit,
            timeouts: { first_token: "60s", total: "5m" },
          }),
        },
      );
      const r = await result;
      expect(aborted).toBe(true);
      expect(calls).toHaveLength(1);
      // Committed at the headers, the client had its 200 before it left.
      const status = commit === "headers" ? 200 : 499;
      expect(r.response.status).toBe(status);
      expect(await r.outcome).toMatchObject({
        status,
        errorCode: "client_closed",
        disconnected: true,
        usage: undefined,
      });
      expect(verdicts).toEqual([["a", "abandon"]]);
    },
  );

  it("leaves an engine that sends no headers within first_token when response_header is longer", async () => {
    const t0 = Date.now();
    const { result, verdicts } = streamedTo({ response_header: "60s", first_token: "150ms" }, ["a"]);
    const r = await result;
    const took = Date.now() - t0;
    expect(r.response.status).toBe(504);
    expect(((await r.response.json()) as { error: { code: string } }).error.code).toBe("first_token_timeout");
    expect(took).toBeGreaterThanOrEqual(140);
    expect(verdicts).toEqual([["a", "fail"]]);
  });

  it("names response_header when it is the tighter of the two", async () => {
    const { result } = streamedTo({ response_header: "100ms", first_token: "60s" }, ["a"]);
    const r = await result;
    expect(r.response.status).toBe(504);
    expect(((await r.response.json()) as { error: { code: string } }).error.code).toBe(
      "response_header_timeout",
    );
  });

  it("retries a stream whose engine sent no headers within first_token on the next endpoint", async () => {
    const { result, verdicts } = streamedTo({ response_header: "60s", first_token: "150ms" }, ["a", "b"]);
    const r = await result;
    expect(r.response.status).toBe(200);
    expect(r.response.headers.get("x-llmgw-attempts")).toBe("2");
    expect(await r.response.text()).toContain('"content":"ok"');
    await r.outcome;
    expect(verdicts).toEqual([
      ["a", "fail"],
      ["b", "ok"],
    ]);
  });

  it.each(["headers", "first_token"] as const)(
    "counts first_token from the attempt's start: headers late within it leave only the rest (committed at %s)",
    async (commit) => {
      vi.useFakeTimers();
      try {
        const late = (init: RequestInit) =>
          new Promise<Response>((resolve) =>
            setTimeout(() => resolve(sse([chunk("x", 1)], { stallAfter: 0, signal: init.signal })), 120),
          );
        const { result } = run({ a: late }, ["a"], {
          stream: true,
          settings: routerSchema.parse({
            stream_commit: commit,
            timeouts: { response_header: "60s", first_token: "200ms", total: "5s" },
          }),
        });
        let ended: Outcome | undefined;
        void result.then((r) => r.outcome).then((o) => (ended = o));
        // Headers at 120 ms leave 80 ms of first_token, not another 200.
        await vi.advanceTimersByTimeAsync(199);
        expect(ended).toBeUndefined();
        await vi.advanceTimersByTimeAsync(2);
        expect(ended?.errorCode).toBe("first_token_timeout");
        const r = await result;
        expect(r.response.status).toBe(commit === "headers" ? 200 : 504);
        expect(await r.response.text()).toContain('"code":"first_token_timeout"');
      } finally {
        vi.useRealTimers();
      }
    },
  );

  describe("streams as engines other than vLLM send them", () => {
    const plain = (content: string, finish: string | null = null, index = 0, usage = "") =>
      `data: {"id":"q","object":"chat.completion.chunk","created":7,"model":"engine-m","choices":[{"index":${index},"delta":{"content":"${content}"},"finish_reason":${finish === null ? "null" : `"${finish}"`}}]${usage}}\n\n`;
    const exact = ',"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}';
    const streamed = (chunks: string[], body: Record<string, unknown> = {}, opts = {}) =>
      run({ a: (init) => sse(chunks, { ...opts, signal: init.signal }) }, ["a"], {
        stream: true,
        body: { model: "m", messages: [{ role: "user", content: "hello there" }], ...body },
      });
    const events = (text: string) =>
      text
        .split("\n\n")
        .filter(Boolean)
        .map((e) => e.slice(6));
    const usageChunks = (text: string) =>
      events(text).filter(
        (e) => e !== "[DONE]" && (JSON.parse(e) as { choices: unknown[] }).choices.length === 0,
      );

    it("takes a stream whose every choice finished as complete without [DONE], and ends it with one", async () => {
      const { result, verdicts } = streamed([plain("Hel"), plain("lo", "stop")]);
      const r = await result;
      const text = await r.response.text();
      expect(text).not.toContain("error");
      expect(events(text).at(-1)).toBe("[DONE]");
      const o = await r.outcome;
      expect([o.completed, o.errorCode]).toEqual([true, null]);
      expect(verdicts).toEqual([["a", "ok"]]);
    });

    it("gives a client that asked for usage exactly one usage chunk, made from the finish chunk's", async () => {
      const { result } = streamed([plain("Hel"), plain("lo", "stop", 0, exact)], {
        stream_options: { include_usage: true },
      });
      const r = await result;
      const text = await r.response.text();
      const [u, ...more] = usageChunks(text);
      expect(more).toEqual([]);
      expect(JSON.parse(u!)).toEqual({
        id: "q",
        object: "chat.completion.chunk",
        created: 7,
        model: "engine-m",
        choices: [],
        usage: { prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 },
      });
      expect(
        events(text)
          .filter((e) => e.includes('"content"'))
          .every((e) => !e.includes("usage")),
      ).toBe(true);
      expect(await r.outcome).toMatchObject({ usageEstimated: false, usage: { completion_tokens: 2 } });
    });

    it("passes a data event that is JSON but no object (`data: null`) on, neither an error nor a crash", async () => {
      const { result, verdicts } = streamed([plain("Hel"), "data: null\n\n", plain("lo", "stop", 0, exact)]);
      const r = await result;
      const text = await r.response.text();
      expect(events(text)).toContain("null");
      expect(text).not.toContain("error");
      expect((await r.outcome).usage!.completion_tokens).toBe(2);
      expect(verdicts).toEqual([["a", "ok"]]);
    });

    it("gives none to a client that did not ask", async () => {
      const { result } = streamed([plain("Hel"), plain("lo", "stop", 0, exact)]);
      const text = await (await result).response.text();
      expect(text).not.toContain("usage");
    });

    it("estimates what an engine that reports no usage used, and says so", async () => {
      const { result } = streamed([plain("Hel"), plain("lo", "stop")], {
        stream_options: { include_usage: true },
      });
      const r = await result;
      const [u] = usageChunks(await r.response.text());
      const o = await r.outcome;
      expect(o.usageEstimated).toBe(true);
      expect(o.usage!.prompt_tokens).toBeGreaterThan(0);
      expect(o.usage!.completion_tokens).toBe(2);
      expect(JSON.parse(u!).usage).toEqual(o.usage);
    });

    it("charges a stream cut before its usage came: an estimate, never zero", async () => {
      const { result, verdicts } = streamed([plain("Hel"), plain("lo")], {}, { endEarly: true });
      const r = await result;
      const text = await r.response.text();
      expect(text).toContain('"code":"upstream_disconnected"');
      expect(text).not.toContain("[DONE]");
      const o = await r.outcome;
      expect([o.completed, o.errorCode, o.usageEstimated]).toEqual([false, "upstream_disconnected", true]);
      expect(o.usage!.prompt_tokens).toBeGreaterThan(0);
      expect(o.usage!.completion_tokens).toBe(2);
      expect(verdicts).toEqual([["a", "fail"]]);
    });

    it("ends a stream closed cleanly before every choice finished with an error, not blaming an engine that finished one", async () => {
      const { result, verdicts } = streamed([plain("a", null, 0), plain("b", "stop", 1)], { n: 2 });
      const r = await result;
      expect(await r.response.text()).toContain('"code":"upstream_disconnected"');
      expect((await r.outcome).completed).toBe(false);
      expect(verdicts).toEqual([["a", "ok"]]);
    });

    it("ends a stream closed cleanly before any choice finished with an error and a failure", async () => {
      const { result, verdicts } = streamed([plain("a"), plain("b")]);
      const r = await result;
      expect(await r.response.text()).toContain('"code":"upstream_disconnected"');
      expect(verdicts).toEqual([["a", "fail"]]);
    });
  });

  it("sends an endpoint's served model name in place of the catalog's, and reports the catalog's", async () => {
    const sent: unknown[] = [];
    const { result } = run(
      {
        a: (init) => {
          sent.push(JSON.parse(String(init.body)).model);
          return Response.json({
            choices: [],
            usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
          });
        },
      },
      ["a"],
      {
        targets: {
          take: (() => {
            const q: Target[] = [
              {
                model: "m",
                endpoint: { ...ep("a"), servedModelName: "org/engine-name" },
                lease: fakeLease([]),
              },
            ];
            return async () => q.shift();
          })(),
        },
      },
    );
    const r = await result;
    expect(sent).toEqual(["org/engine-name"]);
    expect((await r.outcome).model).toBe("m");
  });
});
