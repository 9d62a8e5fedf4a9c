import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createKey,
  type Edge,
  type EngineCounters,
  engineCounters,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * Malformed requests, table-driven: each gets its status and an
 * OpenAI-shaped error, and none of them reaches the engine (its counters
 * do not move; a valid request at the end shows that they would).
 */
const LIMIT = 64 * 1024;

interface Case {
  name: string;
  status: number;
  code?: string | null;
  param?: string | null;
  method?: string;
  path?: string;
  /** Authorization header; default: a valid key. `null` omits it. */
  auth?: string | null | ((k: Keys) => string);
  headers?: Record<string, string>;
  /** A string is sent as is; anything else as JSON. */
  body?: unknown;
  /** Send the body chunked, without Content-Length. */
  chunked?: boolean;
  /** The bytes sent, in place of `body`'s (for encoded bodies; set Content-Encoding in `headers`). */
  bytes?: Uint8Array;
}

interface Keys {
  good: TestKey;
  revoked: TestKey;
  bronze: TestKey;
  betaOnly: TestKey;
}

const msgs = [{ role: "user", content: "hi" }];
const chat = (extra: Record<string, unknown>) => ({ model: "alpha", messages: msgs, ...extra });

const CASES: Case[] = [
  // Authentication: 401
  { name: "no Authorization header", auth: null, body: chat({}), status: 401, code: "invalid_api_key" },
  { name: "Basic scheme", auth: "Basic dXNlcjpwYXNz", body: chat({}), status: 401 },
  { name: "Bearer without a key", auth: "Bearer ", body: chat({}), status: 401 },
  { name: "key too short", auth: "Bearer sk-short", body: chat({}), status: 401 },
  { name: "key without sk- prefix", auth: "Bearer abcdefghijklmnopqrstuvwxyz", body: chat({}), status: 401 },
  {
    name: "well-formed unknown key",
    auth: "Bearer sk-unknown-000000000000000000",
    body: chat({}),
    status: 401,
  },
  {
    name: "two keys in one header",
    auth: (k) => `Bearer ${k.good.secret}, Bearer ${k.bronze.secret}`,
    body: chat({}),
    status: 401,
  },
  { name: "key followed by junk", auth: (k) => `Bearer ${k.good.secret} extra`, body: chat({}), status: 401 },
  {
    name: "key with illegal characters",
    auth: "Bearer sk-abc$def%ghi&jkl*mno(pqr)",
    body: chat({}),
    status: 401,
  },
  { name: "revoked key", auth: (k) => `Bearer ${k.revoked.secret}`, body: chat({}), status: 401 },
  // Bodies that are not JSON objects: 400
  { name: "not JSON", body: "{model: alpha", status: 400, code: "invalid_json" },
  { name: "empty body", body: "", status: 400 },
  { name: "JSON array", body: "[]", status: 400 },
  { name: "JSON string", body: '"hello"', status: 400 },
  { name: "JSON null", body: "null", status: 400 },
  { name: "invalid UTF-8", body: "\u0000INVALID_UTF8\u0000", status: 400 },
  {
    name: "deeply nested JSON",
    body: `{"model":"alpha","messages":${"[".repeat(20000)}${"]".repeat(20000)}}`,
    status: 400,
  },
  // Wrong or missing fields: 400 with the field as param
  { name: "no model", body: { messages: msgs }, status: 400, param: "model" },
  { name: "model is a number", body: { model: 123, messages: msgs }, status: 400, param: "model" },
  { name: "model is empty", body: { model: "", messages: msgs }, status: 400, param: "model" },
  {
    name: "model is 300 characters",
    body: { model: "m".repeat(300), messages: msgs },
    status: 400,
    param: "model",
  },
  { name: "no messages", body: { model: "alpha" }, status: 400, param: "messages" },
  { name: "messages empty", body: { model: "alpha", messages: [] }, status: 400, param: "messages" },
  { name: "messages is a string", body: { model: "alpha", messages: "hi" }, status: 400, param: "messages" },
  {
    name: "unknown role",
    body: chat({ messages: [{ role: "wizard", content: "x" }] }),
    status: 400,
    param: "messages[0].role",
  },
  {
    name: "content is a number",
    body: chat({ messages: [{ role: "user", content: 42 }] }),
    status: 400,
    param: "messages[0].content",
  },
  { name: "negative max_tokens", body: chat({ max_tokens: -1 }), status: 400, param: "max_tokens" },
  { name: "max_tokens is a string", body: chat({ max_tokens: "ten" }), status: 400, param: "max_tokens" },
  { name: "temperature out of range", body: chat({ temperature: 5 }), status: 400, param: "temperature" },
  { name: "stream is a string", body: chat({ stream: "yes" }), status: 400, param: "stream" },
  {
    name: "stream_options is a string",
    body: chat({ stream_options: "on" }),
    status: 400,
    param: "stream_options",
  },
  { name: "n is zero", body: chat({ n: 0 }), status: 400, param: "n" },
  { name: "stop is a number", body: chat({ stop: 42 }), status: 400, param: "stop" },
  {
    name: "completions without prompt",
    path: "/v1/completions",
    body: { model: "alpha" },
    status: 400,
    param: "prompt",
  },
  {
    name: "completions prompt is an object",
    path: "/v1/completions",
    body: { model: "alpha", prompt: {} },
    status: 400,
    param: "prompt",
  },
  {
    name: "embeddings without input",
    path: "/v1/embeddings",
    body: { model: "alpha" },
    status: 400,
    param: "input",
  },
  // Bands: unknown 400, above the key's ceiling 403
  {
    name: "unknown band",
    headers: { "x-llmgw-band": "diamond" },
    body: chat({}),
    status: 400,
    code: "invalid_band",
  },
  {
    name: "band list in the header",
    headers: { "x-llmgw-band": "gold, platinum" },
    body: chat({}),
    status: 400,
    code: "invalid_band",
  },
  {
    name: "band above the key's",
    auth: (k) => `Bearer ${k.bronze.secret}`,
    headers: { "x-llmgw-band": "gold" },
    body: chat({}),
    status: 403,
    code: "band_not_allowed",
  },
  // Models: unknown 404, not allowed 403
  {
    name: "unknown model",
    body: chat({ model: "does-not-exist" }),
    status: 404,
    code: "model_not_found",
    param: "model",
  },
  {
    name: "header injection through the model name",
    body: chat({ model: "alpha\r\nx-llmgw-endpoint: evil" }),
    status: 404,
    code: "model_not_found",
  },
  {
    name: "model the key may not use",
    auth: (k) => `Bearer ${k.betaOnly.secret}`,
    body: chat({}),
    status: 403,
    code: "model_not_allowed",
  },
  // Size: 413 before parsing, declared or counted
  {
    name: "oversized body with Content-Length",
    body: chat({ pad: "x".repeat(LIMIT) }),
    status: 413,
    code: "request_too_large",
  },
  {
    name: "oversized chunked body",
    body: chat({ pad: "x".repeat(LIMIT) }),
    chunked: true,
    status: 413,
    code: "request_too_large",
  },
  { name: "oversized non-JSON body", body: "y".repeat(LIMIT + 1), status: 413 },
  // Encoded bodies: decoded within the limit, or refused
  {
    name: "gzip bomb (10 KB that inflates to 20 MB)",
    headers: { "content-encoding": "gzip" },
    bytes: gzipSync(Buffer.alloc(20_000_000, " ")),
    status: 413,
    code: "request_too_large",
  },
  {
    name: "chunked deflate bomb",
    headers: { "content-encoding": "deflate" },
    bytes: deflateSync(Buffer.alloc(20_000_000, " ")),
    chunked: true,
    status: 413,
    code: "request_too_large",
  },
  {
    name: "brotli body",
    headers: { "content-encoding": "br" },
    bytes: brotliCompressSync(JSON.stringify(chat({}))),
    status: 415,
    code: "unsupported_content_encoding",
  },
  {
    name: "two encodings",
    headers: { "content-encoding": "gzip, gzip" },
    bytes: gzipSync(gzipSync(JSON.stringify(chat({})))),
    status: 415,
    code: "unsupported_content_encoding",
  },
  {
    name: "raw deflate labelled deflate",
    headers: { "content-encoding": "deflate" },
    bytes: deflateRawSync(JSON.stringify(chat({}))),
    status: 400,
    code: "invalid_content_encoding",
  },
  {
    name: "gzip header, plain body",
    headers: { "content-encoding": "gzip" },
    body: chat({}),
    status: 400,
    code: "invalid_content_encoding",
  },
  {
    name: "gzip of a body that is not JSON",
    headers: { "content-encoding": "gzip" },
    bytes: gzipSync("{model: alpha"),
    status: 400,
    code: "invalid_json",
  },
  // Routes
  { name: "unknown path", path: "/v1/nothing", body: chat({}), status: 404 },
  { name: "GET on a POST route", method: "GET", body: undefined, status: 405 },
];

describe("malformed requests", () => {
  let edge: Edge;
  let sim: Sim;
  let keys: Keys;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([
      startEdge({ max_body_bytes: LIMIT }),
      startSim("alpha", ["--served-model-name", "alpha", "beta"]),
    ]);
    await setEndpoints(edge, [{ id: "alpha-1", url: sim.url, models: ["alpha", "beta"] }]);
    const [good, revoked, bronze, betaOnly] = await Promise.all([
      createKey(edge),
      createKey(edge),
      createKey(edge, { band: "bronze" }),
      createKey(edge, { models: ["beta"] }),
    ]);
    await edge.sync.revokeKey({ id: revoked.id });
    keys = { good, revoked, bronze, betaOnly };
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  function send(c: Case): Promise<Response> {
    const headers: Record<string, string> = { "content-type": "application/json", ...c.headers };
    const auth =
      c.auth === undefined
        ? `Bearer ${keys.good.secret}`
        : typeof c.auth === "function"
          ? c.auth(keys)
          : c.auth;
    if (auth !== null) headers.authorization = auth;
    let body: BodyInit | undefined;
    if (c.body !== undefined || c.bytes) {
      let bytes: Uint8Array<ArrayBuffer> = c.bytes
        ? new Uint8Array(c.bytes)
        : typeof c.body === "string"
          ? new TextEncoder().encode(c.body)
          : new TextEncoder().encode(JSON.stringify(c.body));
      if (c.body === "\u0000INVALID_UTF8\u0000") bytes = new Uint8Array([0x7b, 0xff, 0xfe, 0x7d]);
      body = c.chunked
        ? new ReadableStream({
            start(ctrl) {
              for (let i = 0; i < bytes.length; i += 8192) ctrl.enqueue(bytes.slice(i, i + 8192));
              ctrl.close();
            },
          })
        : bytes;
    }
    return fetch(`${edge.url}${c.path ?? "/v1/chat/completions"}`, {
      method: c.method ?? "POST",
      headers,
      body,
      ...(c.chunked ? { duplex: "half" } : {}),
    } as RequestInit);
  }

  it(`answers ${CASES.length} malformed requests with their status and an OpenAI error, none reaching the engine`, async () => {
    expect(CASES.length).toBeGreaterThanOrEqual(30);
    const before: EngineCounters = await engineCounters(sim);
    const failures: string[] = [];
    for (const c of CASES) {
      const res = await send(c);
      const text = await res.text();
      let err: Record<string, unknown> | undefined;
      try {
        err = JSON.parse(text).error;
      } catch {
        err = undefined;
      }
      const problems: string[] = [];
      if (res.status !== c.status) problems.push(`status ${res.status}, want ${c.status}`);
      if (!err) problems.push(`body is not an OpenAI error: ${text.slice(0, 200)}`);
      else {
        if (Object.keys(err).sort().join() !== "code,message,param,type")
          problems.push(`keys ${Object.keys(err)}`);
        if (typeof err.message !== "string" || typeof err.type !== "string")
          problems.push("message/type not strings");
        if (c.code !== undefined && err.code !== c.code) problems.push(`code ${err.code}, want ${c.code}`);
        if (c.param !== undefined && err.param !== c.param)
          problems.push(`param ${err.param}, want ${c.param}`);
      }
      if (res.headers.get("x-llmgw-endpoint")) problems.push("reached routing (x-llmgw-endpoint set)");
      if (!(res.headers.get("content-type") ?? "").startsWith("application/json")) problems.push("not JSON");
      if (problems.length) failures.push(`${c.name}: ${problems.join("; ")}`);
    }
    expect(failures).toEqual([]);
    const after = await engineCounters(sim);
    expect(after).toEqual(before);
    // A valid request does move the counters: the check above can fail.
    const ok = await send({ name: "valid", status: 200, body: chat({ max_tokens: 2 }) });
    expect(ok.status).toBe(200);
    await ok.text();
    expect((await engineCounters(sim)).prompt).toBeGreaterThan(before.prompt);
  });

  it("decodes gzip and deflate bodies, up to the limit once decoded", async () => {
    const json = (extra: Record<string, unknown>) =>
      Buffer.from(JSON.stringify(chat({ max_tokens: 2, ...extra })));
    const sent: [string, Uint8Array, boolean][] = [
      ["gzip", gzipSync(json({})), false],
      ["x-gzip", gzipSync(json({})), false],
      ["DEFLATE", deflateSync(json({})), false],
      ["gzip", gzipSync(json({})), true],
      ["identity", json({}), false],
      // Compressed to a few hundred bytes, decoded just under the limit.
      ["gzip", gzipSync(json({ pad: "x".repeat(LIMIT - 200) })), false],
    ];
    for (const [encoding, bytes, chunked] of sent) {
      const before = await engineCounters(sim);
      const res = await send({
        name: encoding,
        status: 200,
        headers: { "content-encoding": encoding },
        bytes,
        chunked,
      });
      expect(res.status, `${encoding}${chunked ? " chunked" : ""}: ${await res.clone().text()}`).toBe(200);
      expect((await res.json()).choices[0].message.content).toBeTypeOf("string");
      expect((await engineCounters(sim)).finished).toBe(before.finished + 1);
    }
  });
});
