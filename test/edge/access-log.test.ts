import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type Edge,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * The edge's access log (docs/edge.md#access-log): `wrangler dev` prints
 * what the Worker's console.log writes, so the lines it printed are the
 * observable output here. One line per request, refusals included, with the
 * key's id and never its secret.
 */
const line = z.strictObject({
  type: z.literal("llmgw.access"),
  request_id: z.string().regex(/^req_[0-9a-f]{32}$/),
  path: z.string(),
  key_id: z.string().nullable(),
  model: z.string().nullable(),
  model_served: z.string().nullable(),
  band: z.string().nullable(),
  stream: z.boolean(),
  endpoint: z.string().nullable(),
  route: z.string().nullable(),
  admitted: z.enum(["pool", "grant", "fail-open"]).nullable(),
  attempts: z.number().int().min(0),
  status: z.number().int(),
  error_code: z.string().nullable(),
  ttft_ms: z.number().min(0).nullable(),
  prompt_tokens: z.number().int().nullable(),
  completion_tokens: z.number().int().nullable(),
  usage_estimated: z.boolean(),
  duration_ms: z.number().min(0),
  completed: z.boolean(),
  client_disconnected: z.boolean(),
});
type Line = z.output<typeof line>;

describe("the edge's access log", () => {
  let edge: Edge;
  let sim: Sim;
  let key: TestKey;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([startEdge({}, "edge-access-log"), startSim("al")]);
    await edge.sync.putCatalog({ models: [{ name: "al", aliases: [], fallbacks: [], routing: "chat" }] });
    await setEndpoints(edge, [{ id: "al-1", url: sim.url, models: ["al"] }]);
    key = await createKey(edge, { band: "gold", models: ["al"] });
  }, 120_000);

  afterAll(stopStarted);

  /** Every access line the edge printed, parsed (a malformed one fails the test). */
  const lines = (): Line[] =>
    edge.proc
      .output()
      .split("\n")
      .map((l) => l.slice(l.indexOf("{")))
      .filter((l) => l.startsWith('{"type":"llmgw.access"'))
      .map((l) => line.parse(JSON.parse(l)));
  const lineFor = (requestId: string) =>
    waitUntil(`the access line of ${requestId}`, () => lines().find((l) => l.request_id === requestId));

  it("a streamed and a plain chat: key id, model, band, endpoint, route, attempts, status, TTFT, tokens, duration", async () => {
    const openai = clientFor(edge, key.secret);
    const { data: plain, response: r1 } = await openai.chat.completions
      .create({ model: "al", messages: [{ role: "user", content: "Hello there" }], max_tokens: 5 })
      .withResponse();
    const a = await lineFor(r1.headers.get("x-request-id")!);
    expect(a).toMatchObject({
      path: "/v1/chat/completions",
      key_id: key.id,
      model: "al",
      model_served: "al",
      band: "gold",
      stream: false,
      endpoint: "al-1",
      route: r1.headers.get("x-llmgw-route"),
      admitted: r1.headers.get("x-llmgw-admitted"),
      attempts: 1,
      status: 200,
      error_code: null,
      prompt_tokens: plain.usage!.prompt_tokens,
      completion_tokens: plain.usage!.completion_tokens,
      usage_estimated: false,
      completed: true,
      client_disconnected: false,
    });
    expect(a.ttft_ms).not.toBeNull();
    expect(a.duration_ms).toBeGreaterThanOrEqual(a.ttft_ms!);

    const { data: stream, response: r2 } = await openai.chat.completions
      .create({
        model: "al",
        messages: [{ role: "user", content: "Tell me a story" }],
        max_tokens: 12,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse();
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) usage = chunk.usage ?? usage;
    const b = await lineFor(r2.headers.get("x-request-id")!);
    expect(b).toMatchObject({
      stream: true,
      status: 200,
      endpoint: "al-1",
      completed: true,
      prompt_tokens: usage!.prompt_tokens,
      completion_tokens: usage!.completion_tokens,
      usage_estimated: false,
    });
    expect(b.duration_ms).toBeGreaterThanOrEqual(b.ttft_ms!);
  });

  it("refusals too, with their error code; the key's secret is never written", async () => {
    const refused = async (client: OpenAI, model: string, headers: Record<string, string> = {}) => {
      const err = await client.chat.completions
        .create({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 2 }, { headers })
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const e = err as InstanceType<typeof OpenAI.APIError>;
      return { status: e.status, code: e.code, line: await lineFor(e.headers!.get("x-request-id")!) };
    };
    const wrongKey = `${key.secret.slice(0, -4)}zzzz`;
    const bad = await refused(
      new OpenAI({ apiKey: wrongKey, baseURL: `${edge.url}/v1`, maxRetries: 0 }),
      "al",
    );
    expect(bad.line).toMatchObject({
      status: 401,
      error_code: bad.code,
      key_id: null,
      model: null,
      route: null,
      admitted: null,
      attempts: 0,
    });

    const unknown = await refused(clientFor(edge, key.secret), "no-such-model");
    expect(unknown.line).toMatchObject({
      status: 404,
      error_code: unknown.code,
      key_id: key.id,
      model: "no-such-model",
    });

    const band = await refused(clientFor(edge, key.secret), "al", { "x-llmgw-band": "platinum" });
    expect(band.status).toBe(403);
    expect(band.line).toMatchObject({ status: 403, error_code: band.code, key_id: key.id, endpoint: null });

    const printed = edge.proc.output();
    expect(printed).not.toContain(key.secret);
    expect(printed).not.toContain(wrongKey);
  });
});
