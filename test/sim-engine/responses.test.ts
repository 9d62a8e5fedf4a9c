/**
 * The sim engine's Responses API (`POST /v1/responses`) as a black box:
 * real engine processes on loopback, driven with the official `openai`
 * client (v6) and raw fetches where the wire itself is the point. The
 * engine's counters must move by exactly the usage each response reports,
 * as for chat.
 */
import type OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import { counted, type Engine, engine, MODEL, metrics, stopEngines } from "./features-harness.ts";

async function post(e: Engine, body: unknown): Promise<Response> {
  return fetch(`${e.url}/v1/responses`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

/** Everything a stream sent until its connection ended (cleanly or by a reset). */
async function readAll(res: Response): Promise<string> {
  let text = "";
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
  } catch {
    // A crashed engine resets the connection: what arrived before is the point.
  }
  return text;
}

/** A raw SSE body's events: each `event:` line's type beside its data's. */
function events(text: string): { event: string; data: Record<string, unknown> }[] {
  return text
    .split("\n\n")
    .filter((block) => block !== "")
    .map((block) => {
      const m = /^event: (\S+)\ndata: (\{.*\})$/s.exec(block);
      if (!m) throw new Error(`not an event: ${JSON.stringify(block)}`);
      return { event: m[1]!, data: JSON.parse(m[2]!) as Record<string, unknown> };
    });
}

const PROMPT = "Tell me about the fleet of GPU nodes behind the edge, and how the router picks one of them.";

const STREAM_ORDER = (deltas: number) => [
  "response.created",
  "response.in_progress",
  "response.output_item.added",
  "response.content_part.added",
  ...Array.from({ length: deltas }, () => "response.output_text.delta"),
  "response.output_text.done",
  "response.content_part.done",
  "response.output_item.done",
  "response.completed",
];

let main: Engine;
let short: Engine;
let long: Engine;

beforeAll(async () => {
  [main, short, long] = await Promise.all([
    engine("main", ["--seed", "7", "--max-model-len", "2048"]),
    // Natural answers of 3..9 tokens: they end by themselves, well before any limit.
    engine("short", ["--sim-output-len", "6"]),
    // Real time and answers of 1,000..3,000 tokens: a client can leave long before one ends.
    engine("long", ["--sim-speed", "1", "--sim-output-len", "2000"]),
  ]);
});

afterAll(stopEngines);

describe("POST /v1/responses", () => {
  it("non-streamed: stops at max_output_tokens as incomplete; the counters move by its usage", async () => {
    const before = await metrics(main);
    const r = await main.client.responses.create({ model: MODEL, input: PROMPT, max_output_tokens: 12 });
    const after = await metrics(main);
    expect(r.id).toMatch(/^resp_[0-9a-f]{32}$/);
    expect(r.object).toBe("response");
    expect(r.model).toBe(MODEL);
    expect(r.status).toBe("incomplete");
    expect(r.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(r.max_output_tokens).toBe(12);
    expect(r.instructions).toBeNull();
    expect(r.output).toHaveLength(1);
    const item = r.output[0] as OpenAI.Responses.ResponseOutputMessage;
    expect(item).toMatchObject({ type: "message", role: "assistant", status: "incomplete" });
    expect(item.id).toMatch(/^msg_[0-9a-f]{32}$/);
    expect(item.content).toEqual([{ type: "output_text", text: r.output_text, annotations: [] }]);
    expect(r.output_text.length).toBeGreaterThan(0);
    const u = r.usage!;
    expect(u.output_tokens).toBe(12);
    expect(u.input_tokens).toBeGreaterThan(0);
    expect(u.total_tokens).toBe(u.input_tokens + u.output_tokens);
    expect(u.output_tokens_details.reasoning_tokens).toBe(0);
    const moved = counted(before, after);
    expect(moved.prompt).toBe(u.input_tokens);
    expect(moved.generation).toBe(u.output_tokens);
    expect(moved.hits).toBe(u.input_tokens_details.cached_tokens);
    expect(
      after["vllm:request_success_total:length"]! - (before["vllm:request_success_total:length"] ?? 0),
    ).toBe(1);
  });

  it("streamed: vLLM's events in order, numbered 0..k, saying what the non-streamed answer says", async () => {
    // A prompt of its own, so the first of the two finds nothing cached.
    const body = { model: MODEL, input: `Streamed: ${PROMPT}`, max_output_tokens: 12, seed: 11 };
    const plain = await main.client.responses.create(body);
    const before = await metrics(main);
    const stream = await main.client.responses.create({ ...body, stream: true });
    const got: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of stream) got.push(ev);
    const after = await metrics(main);

    expect(got.map((e) => e.type)).toEqual(STREAM_ORDER(12));
    expect(got.map((e) => e.sequence_number)).toEqual(got.map((_, k) => k));
    let deltas = "";
    for (const e of got) if (e.type === "response.output_text.delta") deltas += e.delta;
    expect(deltas).toBe(plain.output_text);
    const created = got[0] as OpenAI.Responses.ResponseCreatedEvent;
    expect(created.response).toMatchObject({ status: "in_progress", output: [], usage: null });
    const done = got.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    expect(done.response.id).toBe(created.response.id);
    expect(done.response.status).toBe("incomplete");
    expect(done.response.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(done.response.output).toEqual(
      plain.output.map((item) => ({ ...item, id: (got[2] as { item: { id: string } }).item.id })),
    );
    // The same prompt a second time: its full blocks come from the prefix cache.
    const { input_tokens_details: streamedCache, ...streamed } = done.response.usage!;
    const { input_tokens_details: plainCache, ...nonStreamed } = plain.usage!;
    expect(streamed).toEqual(nonStreamed);
    expect(plainCache.cached_tokens).toBe(0);
    expect(streamedCache.cached_tokens).toBeGreaterThan(0);
    const moved = counted(before, after);
    expect(moved.prompt).toBe(plain.usage!.input_tokens);
    expect(moved.generation).toBe(plain.usage!.output_tokens);
    expect(moved.hits).toBe(streamedCache.cached_tokens);
  });

  it("the wire: `event:` lines matching each data's type, compact JSON, no [DONE], usage last", async () => {
    const res = await post(main, { model: MODEL, input: PROMPT, max_output_tokens: 3, stream: true });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const text = await readAll(res);
    expect(text).not.toContain("[DONE]");
    expect(text).not.toMatch(/": /);
    const evs = events(text);
    expect(evs.map((e) => e.event)).toEqual(STREAM_ORDER(3));
    for (const e of evs) expect(e.data.type).toBe(e.event);
    const last = text.trimEnd().split("\n").at(-1)!;
    expect(last).toMatch(/,"usage":\{"input_tokens":\d+,.*"total_tokens":\d+\}\}\}$/);

    const plain = await post(main, { model: MODEL, input: PROMPT, max_output_tokens: 3 });
    expect(plain.headers.get("content-type")).toBe("application/json");
    expect(await plain.text()).toMatch(/,"usage":\{[^{}]*\{[^{}]*\}[^{}]*\{[^{}]*\}[^{}]*\}\}$/);
  });

  it("instructions and role items: chat's prompt and answer for the same messages", async () => {
    const r = await main.client.responses.create({
      model: MODEL,
      instructions: "Answer in one line.",
      // An assistant turn may repeat an earlier answer's output_text parts, as OpenAI's clients send it back.
      input: [
        { role: "user", content: "Which node is least loaded?" },
        {
          type: "message",
          role: "assistant",
          content: [{ type: "output_text", text: "Node ", annotations: [] }],
        },
        { role: "developer", content: "Be brief." },
        {
          role: "user",
          content: [
            { type: "input_text", text: "And the second " },
            { type: "input_text", text: "least?" },
          ],
        },
      ] as never,
      max_output_tokens: 9,
      temperature: 0,
      top_p: 0.5,
      store: false,
      metadata: { run: "responses-test" },
      user: "responses-test",
      parallel_tool_calls: false,
    });
    expect(r.instructions).toBe("Answer in one line.");
    expect(r.temperature).toBe(0);
    expect(r.top_p).toBe(0.5);
    const chat = await main.client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: "system", content: "Answer in one line." },
        { role: "user", content: "Which node is least loaded?" },
        { role: "assistant", content: "Node " },
        { role: "developer", content: "Be brief." },
        { role: "user", content: "And the second least?" },
      ],
      max_tokens: 9,
    });
    expect(r.usage!.input_tokens).toBe(chat.usage!.prompt_tokens);
    expect(r.output_text).toBe(chat.choices[0]!.message.content);
  });

  it("an answer that ends by itself is completed, streamed and not", async () => {
    const before = await metrics(short);
    const r = await short.client.responses.create({ model: MODEL, input: PROMPT });
    expect(r.status).toBe("completed");
    expect(r.incomplete_details).toBeNull();
    expect(r.max_output_tokens).toBeNull();
    expect((r.output[0] as OpenAI.Responses.ResponseOutputMessage).status).toBe("completed");
    expect(r.usage!.output_tokens).toBeGreaterThanOrEqual(3);
    expect(r.usage!.output_tokens).toBeLessThanOrEqual(9);

    const stream = await short.client.responses.create({ model: MODEL, input: PROMPT, stream: true });
    const got: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of stream) got.push(ev);
    const done = got.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    expect(done.type).toBe("response.completed");
    expect(done.response.status).toBe("completed");
    const item = (got.at(-2) as OpenAI.Responses.ResponseOutputItemDoneEvent).item;
    expect(item).toMatchObject({ status: "completed", content: [{ text: r.output_text }] });
    const after = await metrics(short);
    expect(after["vllm:request_success_total:stop"]! - (before["vllm:request_success_total:stop"] ?? 0)).toBe(
      2,
    );
    expect(counted(before, after).generation).toBe(2 * r.usage!.output_tokens);
  });

  it("text.format json_schema: the output is a JSON value of the schema", async () => {
    const schema = {
      type: "object",
      properties: { node: { type: "string" }, load: { type: "integer", minimum: 0, maximum: 100 } },
      required: ["node", "load"],
      additionalProperties: false,
    };
    const r = await main.client.responses.create({
      model: MODEL,
      input: PROMPT,
      text: { format: { type: "json_schema", name: "pick", schema, strict: true } },
    });
    expect(r.status).toBe("completed");
    const value = JSON.parse(r.output_text) as { node: unknown; load: number };
    expect(typeof value.node).toBe("string");
    expect(value.load).toBeGreaterThanOrEqual(0);
    expect(value.load).toBeLessThanOrEqual(100);
  });

  it("refuses what it cannot serve, in vLLM's error shape", async () => {
    const cases: [Record<string, unknown>, number, string, RegExp][] = [
      [{ model: MODEL }, 400, "input", /^input: /],
      [{ input: "hi" }, 400, "model", /^model: /],
      [
        { model: MODEL, input: "hi", max_output_tokens: 0 },
        400,
        "max_output_tokens",
        /^max_output_tokens: must be at least 1, got 0$/,
      ],
      [{ model: "nope", input: "hi" }, 404, "model", /^The model `nope` does not exist\.$/],
      [
        { model: MODEL, input: "hi", previous_response_id: "resp_1" },
        400,
        "previous_response_id",
        /stores no responses/,
      ],
      [
        { model: MODEL, input: "hi", tools: [{ type: "function", name: "f" }] },
        400,
        "tools",
        /not supported/,
      ],
      [
        { model: MODEL, input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] },
        400,
        "input.0.content.0",
        /input_image/,
      ],
      [
        { model: MODEL, input: [{ type: "function_call_output", call_id: "c", output: "x" }] },
        400,
        "input.0.type",
        /function_call_output/,
      ],
      [{ model: MODEL, input: [{ role: "robot", content: "x" }] }, 400, "input.0.role", /^input\.0\.role: /],
      [{ model: MODEL, input: "hi", top_p: 0 }, 400, "top_p", /^top_p: /],
    ];
    for (const [body, status, param, message] of cases) {
      const res = await post(main, body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      const err = ((await res.json()) as { error: Record<string, unknown> }).error;
      expect(Object.keys(err)).toEqual(["message", "type", "param", "code"]);
      expect(err, JSON.stringify(body)).toMatchObject({ param, code: status });
      expect(err.message).toMatch(message);
    }
    await expect(
      main.client.responses.create({ model: MODEL, input: "hi", previous_response_id: "resp_1" }),
    ).rejects.toMatchObject({ status: 400, param: "previous_response_id" });
  });

  it("a prompt that fills the context: 400 with vLLM's Responses message; a large max_output_tokens is cut", async () => {
    // " go" is one token: 2,101 of them do not fit 2,048; 2,031 and the template's 8 leave 9 for output.
    const res = await post(main, { model: MODEL, input: "go ".repeat(2100) });
    expect(res.status).toBe(400);
    const err = ((await res.json()) as { error: { message: string; param: string } }).error;
    expect(err.param).toBe("input");
    expect(err.message).toMatch(
      /^The engine prompt length \d+ exceeds the max_model_len 2048\. Please reduce prompt\.$/,
    );
    const fits = await main.client.responses.create({
      model: MODEL,
      input: "go ".repeat(2030),
      max_output_tokens: 500,
    });
    expect(fits.status).toBe("incomplete");
    expect(fits.max_output_tokens).toBe(500);
    expect(fits.usage!.total_tokens).toBe(2048);
  });

  it("a client that leaves mid-stream aborts the request; what was written stays counted", async () => {
    const before = await metrics(long);
    const ac = new AbortController();
    const res = await fetch(`${long.url}/v1/responses`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, input: PROMPT, stream: true }),
      signal: ac.signal,
    });
    const reader = res.body!.getReader();
    let text = "";
    while (!text.includes("response.output_text.delta"))
      text += new TextDecoder().decode((await reader.read()).value);
    ac.abort();
    await waitUntil(
      "the abort counted",
      async () => {
        const m = await metrics(long);
        return counted(before, m).aborted === 1 ? m : undefined;
      },
      10_000,
      50,
    );
    const moved = counted(before, await metrics(long));
    expect(moved.prompt).toBeGreaterThan(0);
    expect(moved.generation).toBeGreaterThanOrEqual(1);
    expect(moved.generation).toBeLessThan(1000);
  });
});

describe("/v1/responses with faults and readiness", () => {
  it("--sim-startup-seconds: 503 while starting, like chat", async () => {
    const starting = await engine("starting", ["--sim-startup-seconds", "30"], false);
    const res = await post(starting, { model: MODEL, input: "hi" });
    expect(res.status).toBe(503);
    expect(((await res.json()) as { error: { type: string; code: number } }).error).toMatchObject({
      type: "ServiceUnavailableError",
      code: 503,
    });
  });

  it("--sim-crash-after 0: the opening events and the first delta, then exit 70", async () => {
    const crashing = await engine("crashing", ["--sim-crash-after", "0"]);
    const res = await post(crashing, { model: MODEL, input: PROMPT, max_output_tokens: 50, stream: true });
    expect(res.status).toBe(200);
    const text = await readAll(res);
    expect(events(text).map((e) => e.event)).toEqual(STREAM_ORDER(1).slice(0, 5));
    expect(await crashing.proc.exited).toBe(70);
  });

  it("--sim-hang-after 0: the opening events (vLLM sends them before the engine answers), then silence", async () => {
    const hanging = await engine("hanging", ["--sim-hang-after", "0"]);
    const res = await post(hanging, { model: MODEL, input: PROMPT, stream: true });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    expect(events(first).map((e) => e.event)).toEqual(["response.created", "response.in_progress"]);
    const next = await Promise.race([
      reader.read().then(() => "data"),
      new Promise((r) => setTimeout(() => r("silence"), 800)),
    ]);
    expect(next).toBe("silence");
    await reader.cancel();
  });
});
