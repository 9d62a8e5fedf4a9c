/**
 * Clients that misbehave, against the Worker in workerd (the bundled
 * Worker under Miniflare, no wrangler dev proxy in front to mask what it
 * answers): fuzzed request bodies and headers on the OpenAI routes
 * (fast-check), and bodies cut short of their length on a raw socket.
 * Every request gets an OpenAI-shaped 4xx — never a 5xx, never a hang —
 * and nothing reaches the engine: the pools admit nothing, the engine's
 * counters do not move (until a valid request at the end shows they would).
 */
import { connect } from "node:net";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  clientFor,
  createKey,
  engineCounters,
  type FastEdge,
  type Sim,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

const RUNS = Number(process.env.LLMGW_FUZZ_RUNS ?? 300);
const LIMIT = 16 * 1024;
const BANDS = ["platinum", "gold", "silver", "bronze"];
const ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] as const;
type Route = (typeof ROUTES)[number];

interface Keys {
  good: TestKey;
  narrow: TestKey;
  revoked: TestKey;
}

const base: Record<Route, Record<string, unknown>> = {
  "/v1/chat/completions": { model: "alpha", messages: [{ role: "user", content: "hi" }], max_tokens: 4 },
  "/v1/completions": { model: "alpha", prompt: "hi", max_tokens: 4 },
  "/v1/embeddings": { model: "alpha", input: "hi" },
};

/** Every field the edge reads on some route: an extra field never takes one of these names. */
const KNOWN = new Set([
  "model",
  "messages",
  "prompt",
  "input",
  "echo",
  "encoding_format",
  "dimensions",
  "stream",
  "stream_options",
  "max_tokens",
  "max_completion_tokens",
  "n",
  "temperature",
  "top_p",
  "presence_penalty",
  "frequency_penalty",
  "seed",
  "stop",
  "user",
]);

/** Values no schema accepts for a field, by route: each a defect on its own. */
const notANumber = fc.oneof(fc.string(), fc.boolean(), fc.array(fc.integer(), { maxLength: 2 }), fc.object());
const wrongValues: Record<Route, Record<string, fc.Arbitrary<unknown>>> = {
  "/v1/chat/completions": {
    model: fc.oneof(fc.integer(), fc.constantFrom("", null, [], {}, "m".repeat(257))),
    messages: fc.oneof(
      fc.string(),
      fc.constantFrom(null, [], [{}], [{ role: "robot", content: "x" }], [{ role: "user", content: 5 }]),
      fc.constantFrom([{ role: "user", content: [{}] }], [{ role: "user", content: [{ type: "" }] }]),
    ),
    max_tokens: fc.oneof(notANumber, fc.constantFrom(0, -1, 1.5)),
    max_completion_tokens: fc.oneof(notANumber, fc.constantFrom(0, -3)),
    n: fc.oneof(notANumber, fc.constantFrom(0, 129, 1.5)),
    temperature: fc.oneof(notANumber, fc.constantFrom(-0.1, 2.1)),
    top_p: fc.oneof(notANumber, fc.constantFrom(1.1, -1)),
    presence_penalty: fc.oneof(notANumber, fc.constantFrom(3, -3)),
    frequency_penalty: fc.oneof(notANumber, fc.constantFrom(3, -3)),
    seed: fc.oneof(notANumber, fc.constant(1.5)),
    stop: fc.oneof(fc.integer(), fc.constant(Array(17).fill("x")), fc.constant([1])),
    user: fc.oneof(fc.integer(), fc.constant("u".repeat(257))),
    stream: fc.oneof(fc.string(), fc.integer()),
    stream_options: fc.oneof(fc.string(), fc.constant({ include_usage: "yes" })),
  },
  "/v1/completions": {
    model: fc.oneof(fc.integer(), fc.constantFrom("", null)),
    prompt: fc.oneof(fc.integer(), fc.constantFrom(null, {}, [], [-1], [1.5], [[]], [true])),
    echo: fc.oneof(fc.string(), fc.integer()),
    max_tokens: fc.oneof(notANumber, fc.constantFrom(0, -1, 1.5)),
    temperature: fc.oneof(notANumber, fc.constant(9)),
  },
  "/v1/embeddings": {
    model: fc.oneof(fc.integer(), fc.constantFrom("", null)),
    input: fc.oneof(fc.integer(), fc.constantFrom(null, {}, [], [-1], [[]], [false])),
    encoding_format: fc.oneof(fc.integer(), fc.constantFrom("hex", "")),
    dimensions: fc.oneof(notANumber, fc.constantFrom(0, 1.5)),
  },
};

interface Case {
  route: Route;
  headers: Record<string, string>;
  /** Which key's secret to send as `Bearer`; or an Authorization header of its own, or none. */
  auth: keyof Keys | { header: string } | null;
  body: string | Uint8Array;
  expect: { status: number; code?: string | null; param?: string };
  defect: string;
}

// Names an object lookup would find on Object.prototype: where the edge looks a string up, they
// must be as unknown as any other.
const PROTO_NAMES = ["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"];
const printable = fc.oneof(
  { weight: 9, arbitrary: fc.stringMatching(/^[!-~][ -~]{0,38}[!-~]$/) },
  { weight: 1, arbitrary: fc.constantFrom(...PROTO_NAMES) },
);
// Headers a client may send that mean nothing to the edge; forbidden ones (host, content-length,
// connection, …) undici would refuse to send anyway.
const noiseHeaders = fc.dictionary(
  fc.oneof(
    fc.stringMatching(/^x-[a-z0-9-]{1,20}$/).filter((h) => h !== "x-llmgw-band" && h !== "x-session-id"),
    fc.constantFrom(
      "user-agent",
      "accept",
      "accept-language",
      "content-type",
      "x-request-id",
      "openai-organization",
      "cookie",
    ),
  ),
  printable,
  { maxKeys: 4 },
);
const extraFields = fc.dictionary(
  fc.string({ minLength: 1, maxLength: 12 }).filter((k) => !KNOWN.has(k) && k !== "__proto__"),
  fc.jsonValue({ maxDepth: 2 }),
  { maxKeys: 3 },
);

const json = (v: unknown) => JSON.stringify(v);

/** A request with exactly one defect, noise elsewhere; the status (and code, param) it must get. */
const caseArb: fc.Arbitrary<Case> = fc
  .tuple(fc.constantFrom(...ROUTES), noiseHeaders, extraFields)
  .chain(([route, headers, extra]) => {
    const ok = { ...extra, ...base[route] };
    const valid = (over: Partial<Case>): Case => ({
      route,
      headers,
      auth: "good",
      body: json(ok),
      expect: { status: 200 },
      defect: "",
      ...over,
    });
    const weighted = <T>(weight: number, arbitrary: fc.Arbitrary<T>) => ({ weight, arbitrary });
    return fc.oneof(
      // The key: always the first check.
      weighted(
        2,
        fc
          .oneof(
            fc.constant(null),
            fc.constant<"revoked">("revoked"),
            printable.map((h) => ({ header: h })),
            printable.map((s) => ({ header: `Bearer ${s}` })),
            fc.stringMatching(/^[A-Za-z0-9_-]{16,64}$/).map((s) => ({ header: `Bearer sk-${s}` })),
          )
          .map((auth) => valid({ auth, expect: { status: 401, code: "invalid_api_key" }, defect: "key" })),
      ),
      // A body that is no JSON object with a model.
      weighted(
        2,
        fc
          .oneof(
            fc.string({ maxLength: 200 }),
            fc.uint8Array({ maxLength: 200 }),
            fc.jsonValue({ maxDepth: 3 }).map(json),
          )
          .filter((b) => {
            try {
              const v = JSON.parse(
                typeof b === "string" ? b : new TextDecoder("utf-8", { fatal: true }).decode(b),
              );
              return !(v && typeof v === "object" && !Array.isArray(v) && "model" in v);
            } catch {
              return true;
            }
          })
          .map((body) => valid({ body, expect: { status: 400 }, defect: "body" })),
      ),
      // One field with a value of the wrong type or out of range.
      weighted(
        5,
        fc
          .constantFrom(...Object.keys(wrongValues[route]))
          .chain((field) => wrongValues[route][field]!.map((v) => [field, v] as const))
          .map(([field, v]) =>
            valid({
              body: json({ ...ok, [field]: v }),
              expect: { status: 400, param: field },
              defect: `field ${field}`,
            }),
          ),
      ),
      // A model the edge does not serve, or one the key may not use.
      fc
        .oneof(fc.string({ minLength: 1, maxLength: 256 }), fc.constantFrom(...PROTO_NAMES))
        .filter((m) => m !== "alpha" && m !== "beta")
        .map((model) =>
          valid({
            body: json({ ...ok, model }),
            expect: { status: 404, code: "model_not_found" },
            defect: "model",
          }),
        ),
      fc.constant(
        valid({
          auth: "narrow",
          body: json({ ...ok, model: "beta" }),
          expect: { status: 403, code: "model_not_allowed" },
          defect: "model not allowed",
        }),
      ),
      // A band that does not exist, or one above the key's.
      printable
        .filter((b) => !BANDS.includes(b.trim().toLowerCase()))
        .map((b) =>
          valid({
            headers: { ...headers, "x-llmgw-band": b },
            expect: { status: 400, code: "invalid_band" },
            defect: "band",
          }),
        ),
      fc.constantFrom("platinum", "Gold", " silver ").map((b) =>
        valid({
          auth: "narrow",
          headers: { ...headers, "x-llmgw-band": b },
          expect: { status: 403, code: "band_not_allowed" },
          defect: "band above the key's",
        }),
      ),
      // A session id past 256 characters.
      fc
        .stringMatching(/^[!-~]{257,400}$/)
        .map((s) =>
          valid({ headers: { ...headers, "x-session-id": s }, expect: { status: 400 }, defect: "session" }),
        ),
      // An encoding the edge does not decode, or gzip that is not gzip.
      fc
        .oneof(fc.stringMatching(/^[a-z0-9,-]{1,20}$/), fc.constantFrom(...PROTO_NAMES))
        .filter((e) => !["gzip", "x-gzip", "deflate", "identity"].includes(e))
        .map((e) =>
          valid({
            headers: { ...headers, "content-encoding": e },
            expect: { status: 415, code: "unsupported_content_encoding" },
            defect: "encoding",
          }),
        ),
      fc.constant(
        valid({
          headers: { ...headers, "content-encoding": "gzip" },
          expect: { status: 400, code: "invalid_content_encoding" },
          defect: "not gzip",
        }),
      ),
      // Over router.max_body_bytes.
      fc.integer({ min: 1, max: 4 * LIMIT }).map((n) =>
        valid({
          body: json({ ...ok, pad: "x".repeat(LIMIT + n) }),
          expect: { status: 413, code: "request_too_large" },
          defect: "size",
        }),
      ),
    );
  });

describe("clients that misbehave, against the Worker in workerd", () => {
  let edge: FastEdge;
  let sim: Sim;
  let keys: Keys;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([startEdgeMiniflare({ max_body_bytes: LIMIT }), startSim("alpha")]);
    await setEndpoints(edge, [{ id: "alpha-1", url: sim.url, models: ["alpha", "beta"] }]);
    const [good, narrow, revoked] = await Promise.all([
      createKey(edge, { band: "gold" }),
      createKey(edge, { band: "bronze", models: ["alpha"] }),
      createKey(edge, { band: "gold" }),
    ]);
    await edge.sync.revokeKey({ id: revoked.id });
    keys = { good, narrow, revoked };
  }, 90_000);

  afterAll(stopStarted);

  /** Requests the pools admitted (or Workers routed without them): what could have reached an engine. */
  async function dispatched(): Promise<number> {
    const { pools } = await edge.sync.getPoolStatus({});
    let n = 0;
    for (const p of pools) {
      n += Number(p.failOpens);
      for (const b of p.bands) n += Number(b.admitted);
    }
    return n;
  }

  async function send(c: Case): Promise<Response> {
    const headers: Record<string, string> = { ...c.headers };
    if (c.auth === null) delete headers.authorization;
    else if (typeof c.auth === "string") headers.authorization = `Bearer ${keys[c.auth].secret}`;
    else headers.authorization = c.auth.header;
    return fetch(`${edge.url}${c.route}`, {
      method: "POST",
      headers,
      body: c.body as BodyInit,
      signal: AbortSignal.timeout(15_000),
    });
  }

  it(`answers fuzzed bodies and headers with an OpenAI-shaped 4xx, and sends nothing to the engine (${RUNS} runs)`, async () => {
    const engineBefore = await engineCounters(sim);
    const admittedBefore = await dispatched();
    const seen = new Map<string, number>();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        const res = await send(c);
        const text = await res.text();
        const what = `${c.defect} on ${c.route}: ${res.status} ${text.slice(0, 300)}`;
        expect(res.status, what).toBe(c.expect.status);
        expect(res.headers.get("content-type"), what).toBe("application/json");
        const body = JSON.parse(text) as { error: Record<string, unknown> };
        expect(Object.keys(body), what).toEqual(["error"]);
        expect(Object.keys(body.error).sort(), what).toEqual(["code", "message", "param", "type"]);
        expect(typeof body.error.message === "string" && body.error.message.length > 0, what).toBe(true);
        expect(typeof body.error.type, what).toBe("string");
        if (c.expect.code !== undefined) expect(body.error.code, what).toBe(c.expect.code);
        if (c.expect.param !== undefined)
          expect(String(body.error.param), what).toMatch(new RegExp(`^${c.expect.param}`));
        expect(await dispatched(), what).toBe(admittedBefore);
        seen.set(
          `${c.defect.replace(/^field .*/, "field")} → ${res.status}`,
          (seen.get(`${c.defect.replace(/^field .*/, "field")} → ${res.status}`) ?? 0) + 1,
        );
      }),
      { numRuns: RUNS, endOnFailure: true, interruptAfterTimeLimit: 240_000, markInterruptAsFailure: true },
    );
    console.log(
      `OpenAI routes fuzz: ${RUNS} runs; defects and answers:\n${[...seen]
        .sort()
        .map(([k, n]) => `  ${k}: ${n}`)
        .join("\n")}`,
    );
    expect(await engineCounters(sim)).toEqual(engineBefore);
  }, 300_000);

  /** Sends a request head and part of its body on a raw socket, then half-closes or drops it. */
  function cutShort(
    how: "half-close" | "drop",
    framing: "content-length" | "chunked",
  ): Promise<{ status: number; body: string } | undefined> {
    const u = new URL(edge.url);
    const body = JSON.stringify(base["/v1/chat/completions"]);
    const part = body.slice(0, body.length >> 1);
    const head = [
      "POST /v1/chat/completions HTTP/1.1",
      `host: ${u.host}`,
      "content-type: application/json",
      `authorization: Bearer ${keys.good.secret}`,
      framing === "content-length" ? `content-length: ${body.length}` : "transfer-encoding: chunked",
      "",
      "",
    ].join("\r\n");
    const sent = framing === "content-length" ? part : `${part.length.toString(16)}\r\n${part}\r\n`;
    return new Promise((resolve, reject) => {
      const sock = connect(Number(u.port), u.hostname);
      let text = "";
      sock.on("connect", () => {
        sock.write(head + sent, () => {
          if (how === "half-close") sock.end();
          else {
            sock.destroy();
            resolve(undefined);
          }
        });
      });
      sock.on("data", (d: Buffer) => {
        text += d.toString("utf8");
      });
      sock.on("close", () => {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
        resolve({ status, body: text.slice(text.indexOf("\r\n\r\n") + 4) });
      });
      sock.on("error", reject);
      sock.setTimeout(15_000, () => reject(new Error("no answer to a body cut short")));
    });
  }

  it("answers a body cut short of its Content-Length or its last chunk with 400 incomplete_body", async () => {
    const before = await dispatched();
    for (const framing of ["content-length", "chunked"] as const) {
      const r = await cutShort("half-close", framing);
      expect(r?.status, `${framing}: ${r?.body}`).toBe(400);
      const { error } = JSON.parse(r!.body) as { error: Record<string, unknown> };
      expect(error).toMatchObject({ type: "invalid_request_error", code: "incomplete_body", param: null });
      expect(error.message).toMatch(/request body ended before/);
    }
    expect(await dispatched()).toBe(before);
  });

  it("lets a client that drops the connection mid-body go, and keeps serving", async () => {
    const [before, engineBefore] = await Promise.all([dispatched(), engineCounters(sim)]);
    await Promise.all([cutShort("drop", "content-length"), cutShort("drop", "chunked")]);
    // Nothing was admitted for them; the next client is served, and now the engine moves.
    const r = await clientFor(edge, keys.good.secret).chat.completions.create({
      model: "alpha",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 3,
    });
    expect(r.usage?.completion_tokens).toBe(3);
    expect(await dispatched()).toBe(before + 1);
    const after = await engineCounters(sim);
    expect(after.generation).toBe(engineBefore.generation + 3);
  });
});
