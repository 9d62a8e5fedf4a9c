import { describe, expect, it } from "vitest";
import { type End, earlyEnd, type Failure, outcomeOf, statusFailure, thrownFailure } from "./failure.ts";
import { PhaseTimeout } from "./timeouts.ts";

/** Each way an attempt fails, as the client sees it and as the breaker hears it. */
const cases: [
  string,
  Failure,
  { status: number; code: string | null; retryable: boolean; verdict: string },
][] = [
  [
    "503 from the engine",
    statusFailure("a", 503, '{"error":{"message":"busy"}}'),
    { status: 503, code: null, retryable: true, verdict: "fail" },
  ],
  [
    "429 from the engine: retried, but the engine is alive",
    statusFailure("a", 429, "slow down"),
    { status: 429, code: null, retryable: true, verdict: "ok" },
  ],
  [
    "400 from the engine",
    statusFailure("a", 400, '{"detail":"bad"}'),
    { status: 400, code: null, retryable: false, verdict: "ok" },
  ],
  [
    "401 from the engine: it refused the edge's key, the endpoint's fault",
    statusFailure("a", 401, '{"error":"Unauthorized"}'),
    { status: 502, code: "upstream_unauthorized", retryable: true, verdict: "fail" },
  ],
  [
    "403 from the engine (or the Access in front of it): the same",
    statusFailure("a", 403, "<html><title>Forbidden</title></html>"),
    { status: 502, code: "upstream_unauthorized", retryable: true, verdict: "fail" },
  ],
  [
    "connection refused",
    thrownFailure("a", "connect", new TypeError("refused"), undefined),
    { status: 503, code: "upstream_unreachable", retryable: true, verdict: "fail" },
  ],
  [
    "header wait timed out",
    thrownFailure("a", "connect", new Error("aborted"), new PhaseTimeout("response_header", 100)),
    { status: 504, code: "response_header_timeout", retryable: true, verdict: "fail" },
  ],
  [
    "a non-streamed body that broke",
    thrownFailure("a", "read", new Error("reset"), undefined),
    { status: 503, code: "upstream_error", retryable: true, verdict: "fail" },
  ],
  [
    "a non-streamed body over total",
    thrownFailure("a", "read", new PhaseTimeout("total", 5), undefined),
    { status: 504, code: "total_timeout", retryable: true, verdict: "fail" },
  ],
  [
    "no first token in time",
    thrownFailure("a", "first_token", new Error("aborted"), new PhaseTimeout("first_token", 200)),
    { status: 504, code: "first_token_timeout", retryable: true, verdict: "fail" },
  ],
  [
    "closed before the first token",
    earlyEnd("a", "first_token", false),
    { status: 503, code: "upstream_error", retryable: true, verdict: "fail" },
  ],
  [
    "an engine's error event before the first token",
    earlyEnd("a", "first_token", false, { message: "oom", type: "server_error", param: null, code: "x" }),
    { status: 500, code: "x", retryable: true, verdict: "fail" },
  ],
  [
    "cut mid-stream before any choice finished",
    thrownFailure("a", "relay", new Error("reset"), undefined, false),
    { status: 502, code: "upstream_disconnected", retryable: false, verdict: "fail" },
  ],
  [
    "cut mid-stream after a choice finished: the engine was working",
    thrownFailure("a", "relay", new Error("reset"), undefined, true),
    { status: 502, code: "upstream_disconnected", retryable: false, verdict: "ok" },
  ],
  [
    "silent mid-stream",
    thrownFailure("a", "relay", new Error("aborted"), new PhaseTimeout("idle", 60), false),
    { status: 504, code: "idle_timeout", retryable: false, verdict: "fail" },
  ],
  [
    "ended cleanly with no choice finished",
    earlyEnd("a", "relay", false),
    { status: 502, code: "upstream_disconnected", retryable: false, verdict: "fail" },
  ],
  [
    "ended cleanly with one of two choices finished",
    earlyEnd("a", "relay", true),
    { status: 502, code: "upstream_disconnected", retryable: false, verdict: "ok" },
  ],
];

describe("failure", () => {
  it.each(cases)("%s", (_name, f, want) => {
    expect({
      status: f.error.status,
      code: f.error.code,
      retryable: f.retryable,
      verdict: f.verdict,
    }).toEqual(want);
    expect(f.error.message.length).toBeGreaterThan(0);
  });
});

describe("an engine that refuses the edge's key", () => {
  it.each([401, 403])(
    "%i: names the endpoint and what to check, in OpenAI's shape, and never repeats the engine's body",
    async (status) => {
      const f = statusFailure("h100-a@eu", status, '{"error":"Invalid API key sk-edge-secret"}');
      expect(f.error.type).toBe("server_error");
      expect(f.error.message).toContain("h100-a@eu");
      expect(f.error.message).toContain("refused the edge's key");
      expect(f.error.message).toContain(`HTTP ${status}`);
      expect(f.error.message).not.toContain("sk-edge-secret");
      expect(f.error.headers["retry-after"]).toBeUndefined();
      const body = JSON.parse(await f.error.toResponse().text());
      expect(Object.keys(body.error).sort()).toEqual(["code", "message", "param", "type"]);
    },
  );

  it("is counted as the engine's failure in the outcome, with its code", () => {
    const o = outcomeOf(
      { endpoint: "a", model: "m", attempts: 1 },
      { kind: "refused", failure: statusFailure("a", 401, "") },
    );
    expect(o).toMatchObject({
      status: 502,
      errorCode: "upstream_unauthorized",
      verdict: "fail",
      disconnected: false,
    });
    expect(o.why).toMatch(/^upstream_unauthorized: The engine \(a\) refused the edge's key/);
  });
});

describe("outcomeOf", () => {
  const where = { endpoint: "a", model: "m", attempts: 2 };
  const usage = { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 };
  const cut = thrownFailure("a", "relay", new Error("reset"), undefined, false);
  const refused = statusFailure("a", 503, "busy");
  const rows: [string, End, Record<string, unknown>][] = [
    [
      "answered",
      { kind: "answered" },
      { status: 200, completed: true, disconnected: false, errorCode: null, verdict: "ok" },
    ],
    [
      "refused",
      { kind: "refused", failure: refused },
      { status: 503, completed: false, disconnected: false, errorCode: null, verdict: "fail" },
    ],
    [
      "cut",
      { kind: "cut", failure: cut },
      {
        status: 200,
        completed: false,
        disconnected: false,
        errorCode: "upstream_disconnected",
        verdict: "fail",
      },
    ],
    [
      "left",
      { kind: "left" },
      { status: 200, completed: false, disconnected: true, errorCode: "client_closed", verdict: "abandon" },
    ],
  ];
  it.each(rows)("%s", (_name, end, want) => {
    const o = outcomeOf(where, end, { usage, estimated: true });
    expect(o).toMatchObject({
      ...want,
      endpointId: "a",
      model: "m",
      attempts: 2,
      usage,
      usageEstimated: true,
    });
  });

  it("marks no estimate when there is no usage", () => {
    expect(outcomeOf(where, { kind: "refused", failure: refused }).usageEstimated).toBe(false);
  });
});
