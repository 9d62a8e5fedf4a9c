/**
 * The sim engine's n > 1, tools, response_format and logprobs, against a
 * real engine process with the official `openai` client: each feature
 * streamed and not, the two usages equal, and both equal to what the
 * engine's own counters (vllm:prompt_tokens_total,
 * vllm:generation_tokens_total) moved by.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { tokenize } from "../../sim-engine/text.ts";
import { freePort, type Proc, startLlmgw, waitForHttp, waitUntil } from "../harness/process.ts";

const MODEL = "sim";
const procs: Proc[] = [];

interface Engine {
  url: string;
  client: OpenAI;
}

async function engine(name: string, flags: string[]): Promise<Engine> {
  const port = await freePort();
  const proc = startLlmgw(name, [
    "sim-engine",
    "serve",
    MODEL,
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    "--sim-speed",
    "50",
    ...flags,
  ]);
  procs.push(proc);
  const url = `http://127.0.0.1:${port}`;
  await waitForHttp(proc, `${url}/health`);
  return { url, client: new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 }) };
}

async function metrics(e: Engine): Promise<Record<string, number>> {
  const text = await (await fetch(`${e.url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const m = /^(vllm:[a-z_]+)(?:\{[^}]*finished_reason="(\w+)"[^}]*\}|\{[^}]*\}) (\S+)$/.exec(line);
    if (!m) continue;
    const key = m[2] ? `${m[1]}:${m[2]}` : m[1]!;
    out[key] = (out[key] ?? 0) + Number(m[3]);
  }
  return out;
}

const counted = (before: Record<string, number>, after: Record<string, number>) => ({
  prompt: after["vllm:prompt_tokens_total"]! - before["vllm:prompt_tokens_total"]!,
  generation: after["vllm:generation_tokens_total"]! - before["vllm:generation_tokens_total"]!,
  hits: after["vllm:prefix_cache_hits_total"]! - before["vllm:prefix_cache_hits_total"]!,
  aborted:
    (after["vllm:request_success_total:abort"] ?? 0) - (before["vllm:request_success_total:abort"] ?? 0),
});

/** What a stream said, per choice, put back together. */
interface StreamedChoice {
  content: string;
  role?: string;
  toolCall?: { id: string; name: string; arguments: string; heads: number };
  finish: string | null;
  logprobs: OpenAI.ChatCompletionTokenLogprob[];
  /** completion_tokens on this choice's last chunk (continuous stats count per choice). */
  lastUsage: number;
}

async function streamChat(e: Engine, body: Record<string, unknown>) {
  const stream = await e.client.chat.completions.create({
    ...body,
    stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  } as never);
  const choices = new Map<number, StreamedChoice>();
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const chunk of stream as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>) {
    if (chunk.choices.length === 0) {
      usage = chunk.usage!;
      continue;
    }
    expect(chunk.choices).toHaveLength(1);
    const ch = chunk.choices[0]!;
    const c = choices.get(ch.index) ?? { content: "", finish: null, logprobs: [], lastUsage: 0 };
    choices.set(ch.index, c);
    if (ch.delta.role) c.role = ch.delta.role;
    c.content += ch.delta.content ?? "";
    for (const t of ch.delta.tool_calls ?? []) {
      expect(t.index).toBe(0);
      if (t.id) {
        expect(c.toolCall).toBeUndefined();
        c.toolCall = { id: t.id, name: t.function!.name!, arguments: "", heads: 1 };
      } else expect(t.function?.name).toBeUndefined();
      c.toolCall!.arguments += t.function?.arguments ?? "";
    }
    c.logprobs.push(...(ch.logprobs?.content ?? []));
    if (ch.finish_reason) c.finish = ch.finish_reason;
    c.lastUsage = chunk.usage!.completion_tokens;
  }
  const ordered = [...choices.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => c);
  return { choices: ordered, usage: usage! };
}

/**
 * The same request non-streamed, then streamed: returns both, after checking
 * that their usages are equal, that the streamed per-choice counts add up to
 * it, and that the engine's counters moved by exactly both usages.
 */
async function bothWays(e: Engine, body: Record<string, unknown>) {
  const before = await metrics(e);
  const plain = await e.client.chat.completions.create(
    body as never as OpenAI.ChatCompletionCreateParamsNonStreaming,
  );
  const streamed = await streamChat(e, body);
  const after = await metrics(e);
  expect(streamed.usage).toEqual(plain.usage);
  expect(streamed.choices.reduce((s, c) => s + c.lastUsage, 0)).toBe(plain.usage!.completion_tokens);
  const moved = counted(before, after);
  expect(moved.prompt).toBe(2 * plain.usage!.prompt_tokens);
  expect(moved.generation).toBe(2 * plain.usage!.completion_tokens);
  return { plain, streamed, moved };
}

/** A raw streamed chat request with continuous usage, read chunk by chunk, and a hang-up. */
async function rawStream(e: Engine, body: Record<string, unknown>) {
  const ac = new AbortController();
  const res = await fetch(`${e.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: MODEL,
      ...body,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    }),
    signal: ac.signal,
  });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  return {
    read: async () => decoder.decode((await reader.read()).value, { stream: true }),
    hangUp: () => ac.abort(),
  };
}

const WEATHER: OpenAI.ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", minLength: 2 },
        unit: { enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};
const SEARCH: OpenAI.ChatCompletionTool = {
  type: "function",
  function: { name: "search_docs", parameters: { type: "object", properties: { q: { type: "string" } } } },
};
const conforms = (schema: unknown, value: unknown) =>
  (z as unknown as { fromJSONSchema(s: unknown): z.ZodType }).fromJSONSchema(schema).safeParse(value).success;
const user = (content: string) => [{ role: "user" as const, content }];

let main: Engine;
let plain: Engine;
let hangMid: Engine;

beforeAll(async () => {
  [main, plain, hangMid] = await Promise.all([
    engine("features", ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--seed", "4"]),
    engine("no-auto-tools", []),
    engine("hang-mid-n", ["--sim-hang-after", "0", "--sim-hang-phase", "mid-stream"]),
  ]);
});

afterAll(async () => {
  await Promise.all(procs.map((p) => p.kill("SIGKILL")));
});

describe("n > 1", () => {
  it("chat: n choices with their own index, distinct text, prompt counted once, the prompt computed once", async () => {
    // A fresh prompt of several blocks: choices 1..n-1 find choice 0's blocks in the prefix cache.
    const content = `n test ${Date.now()}: ${"the fleet of GPU nodes behind the edge ".repeat(8)}`;
    const {
      plain: r,
      streamed,
      moved,
    } = await bothWays(main, {
      model: MODEL,
      messages: user(content),
      n: 3,
      max_tokens: 12,
      seed: 5,
    });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    const texts = r.choices.map((c) => c.message.content!);
    expect(new Set(texts).size).toBe(3);
    expect(r.choices.every((c) => c.finish_reason === "length")).toBe(true);
    expect(r.usage!.completion_tokens).toBe(36);
    for (const t of texts) expect(tokenize(t)).toHaveLength(12);
    // Streamed: the same choices (same seed), each with its role chunk and its own finish.
    expect(streamed.choices.map((c) => c.content)).toEqual(texts);
    expect(
      streamed.choices.every((c) => c.role === "assistant" && c.finish === "length" && c.lastUsage === 12),
    ).toBe(true);
    const prompt = r.usage!.prompt_tokens;
    const cachedPerChoice = Math.floor((prompt - 1) / 16) * 16;
    // First request: choices 1 and 2 hit choice 0's blocks; second: all three hit.
    expect(moved.hits).toBe(2 * cachedPerChoice + 3 * cachedPerChoice);
  });

  it("completions: n choices, streamed and not", async () => {
    const body = { model: MODEL, prompt: "Once upon a time", n: 2, max_tokens: 5, seed: 1 };
    const before = await metrics(main);
    const r = await main.client.completions.create(body);
    const s = await main.client.completions.create({
      ...body,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    } as never);
    const text = ["", ""];
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of s as unknown as AsyncIterable<OpenAI.Completion>) {
      if (chunk.choices.length === 0) usage = chunk.usage;
      for (const c of chunk.choices) text[c.index] += c.text;
    }
    const moved = counted(before, await metrics(main));
    expect(r.choices.map((c) => c.text)).toEqual(text);
    expect(text[0]).not.toBe(text[1]);
    expect(usage).toEqual(r.usage);
    expect(r.usage!.completion_tokens).toBe(10);
    expect(moved).toMatchObject({ prompt: 2 * r.usage!.prompt_tokens, generation: 20 });
  });

  it("refuses n above the sim's bound", async () => {
    const err = await main.client.chat.completions
      .create({ model: MODEL, messages: user("x"), n: 129 })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.param).toBe("n");
  });

  it("a client that leaves mid-stream is charged what every choice generated, the prompt once", async () => {
    const before = await metrics(main);
    const stream = await rawStream(main, {
      messages: user("disconnect with four choices"),
      n: 4,
      max_tokens: 1500,
      ignore_eos: true,
    });
    const seen = new Map<number, number>();
    let buf = "";
    let prompt = 0;
    while ([...seen.values()].filter((n) => n >= 5).length < 4) {
      buf += await stream.read();
      const events = buf.split("\n\n");
      buf = events.pop()!;
      for (const ev of events) {
        const obj = JSON.parse(ev.slice(6));
        prompt = obj.usage.prompt_tokens;
        seen.set(obj.choices[0].index, obj.usage.completion_tokens);
      }
    }
    stream.hangUp();
    await waitUntil(
      "choices gone",
      async () => (await metrics(main))["vllm:num_requests_running"] === 0,
      5000,
      20,
    );
    const moved = counted(before, await metrics(main));
    expect(moved.prompt).toBe(prompt);
    expect(moved.generation).toBeGreaterThanOrEqual([...seen.values()].reduce((a, b) => a + b, 0));
    expect(moved.generation).toBeLessThan(4 * 1500);
    expect(moved.aborted).toBe(4);
  });

  it("--sim-hang-phase mid-stream: one token per choice, all of them counted, then nothing", async () => {
    const before = await metrics(hangMid);
    const stream = await rawStream(hangMid, { messages: user("hang with three choices"), n: 3 });
    let text = "";
    while ((text.match(/"delta":\{"content":/g) ?? []).length < 3) text += await stream.read();
    await waitUntil(
      "choices stopped",
      async () => (await metrics(hangMid))["vllm:num_requests_running"] === 0,
      5000,
      20,
    );
    const moved = counted(before, await metrics(hangMid));
    expect(moved.generation).toBe(3);
    expect(moved.prompt).toBe(JSON.parse(text.split("\n\n")[0]!.slice(6)).usage.prompt_tokens);
    expect(text.match(/"role":"assistant"/g)).toHaveLength(3);
    expect(text).not.toContain("[DONE]");
    stream.hangUp();
  });
});

describe("tools", () => {
  const args = (c: OpenAI.ChatCompletion.Choice) => {
    const call = c.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    return { name: call.function.name, id: call.id, arguments: call.function.arguments };
  };

  it("auto: calls the tool the user names, arguments matching its parameters; streamed as vLLM streams them", async () => {
    const { plain: r, streamed } = await bothWays(main, {
      model: MODEL,
      messages: user("What is the weather in Paris? Use get_weather."),
      tools: [SEARCH, WEATHER],
      n: 2,
    });
    for (const [i, c] of r.choices.entries()) {
      expect(c.finish_reason).toBe("tool_calls");
      expect(c.message.content).toBeNull();
      expect(c.message.tool_calls).toHaveLength(1);
      const call = args(c);
      expect(call.name).toBe("get_weather");
      expect(call.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
      expect(conforms(WEATHER.function.parameters, JSON.parse(call.arguments))).toBe(true);
      const s = streamed.choices[i]!;
      expect(s.toolCall).toMatchObject({ name: "get_weather", arguments: call.arguments, heads: 1 });
      expect(s.content).toBe("");
      expect(s.finish).toBe("tool_calls");
      // Every output token is a fragment of the arguments.
      expect(s.lastUsage).toBe(tokenize(call.arguments).length);
    }
    expect(args(r.choices[0]!).arguments).not.toBe(args(r.choices[1]!).arguments);
    expect(r.usage!.completion_tokens).toBe(
      r.choices.reduce((n, c) => n + tokenize(args(c).arguments).length, 0),
    );
  });

  it("the openai client's stream helper assembles the call", async () => {
    const body = {
      model: MODEL,
      messages: user("search_docs for the routing rules"),
      tools: [WEATHER, SEARCH],
      tool_choice: "required" as const,
    };
    const final = await main.client.chat.completions.stream(body).finalChatCompletion();
    const r = await main.client.chat.completions.create(body);
    expect(args(final.choices[0]!).name).toBe("search_docs");
    expect(args(final.choices[0]!).arguments).toBe(args(r.choices[0]!).arguments);
    expect(final.choices[0]!.finish_reason).toBe("tool_calls");
  });

  it("auto without a mention answers in text; required calls the first tool; a named function is called", async () => {
    const text = await bothWays(main, {
      model: MODEL,
      messages: user("Hello there"),
      tools: [WEATHER],
      max_tokens: 6,
    });
    expect(text.plain.choices[0]!.message.tool_calls).toEqual([]);
    expect(text.plain.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(text.streamed.choices[0]!.toolCall).toBeUndefined();
    const required = await bothWays(main, {
      model: MODEL,
      messages: user("Hello there"),
      tools: [WEATHER, SEARCH],
      tool_choice: "required",
    });
    expect(args(required.plain.choices[0]!).name).toBe("get_weather");
    const named = await bothWays(main, {
      model: MODEL,
      messages: user("Hello there"),
      tools: [WEATHER, SEARCH],
      tool_choice: { type: "function", function: { name: "search_docs" } },
    });
    expect(args(named.plain.choices[0]!).name).toBe("search_docs");
    expect(named.streamed.choices[0]!.toolCall!.name).toBe("search_docs");
    // After the tool's result the answer is text.
    const after = await main.client.chat.completions.create({
      model: MODEL,
      max_tokens: 4,
      tools: [WEATHER],
      messages: [
        { role: "user", content: "get_weather for Oslo" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } },
          ],
        },
        { role: "tool", tool_call_id: "c1", content: "-3 C" },
      ],
    });
    expect(after.choices[0]!.finish_reason).toBe("length");
    expect(after.choices[0]!.message.content!.length).toBeGreaterThan(0);
  });

  it("max_tokens cuts the arguments short: finish_reason length", async () => {
    const { plain: r, streamed } = await bothWays(main, {
      model: MODEL,
      messages: user("get_weather"),
      tools: [WEATHER],
      max_tokens: 3,
    });
    expect(r.choices[0]!.finish_reason).toBe("length");
    expect(tokenize(args(r.choices[0]!).arguments)).toHaveLength(3);
    expect(streamed.choices[0]!.finish).toBe("length");
  });

  it("refuses what vLLM refuses", async () => {
    const bad = async (e: Engine, body: Record<string, unknown>) =>
      e.client.chat.completions
        .create({ model: MODEL, messages: user("x"), ...body } as never)
        .catch((err) => err);
    const noFlags = await bad(plain, { tools: [WEATHER] });
    expect(noFlags).toBeInstanceOf(OpenAI.BadRequestError);
    expect(noFlags.message).toContain(
      '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser',
    );
    expect(noFlags.param).toBe("tool_choice");
    // Without auto the flags are not needed.
    const forced = await plain.client.chat.completions.create({
      model: MODEL,
      messages: user("x"),
      tools: [WEATHER],
      tool_choice: "required",
    });
    expect(forced.choices[0]!.finish_reason).toBe("tool_calls");
    expect((await bad(main, { tool_choice: "required" })).message).toContain("`tools` must be set");
    const unknown = await bad(main, {
      tools: [WEATHER],
      tool_choice: { type: "function", function: { name: "nope" } },
    });
    expect(unknown.message).toContain("Tool 'nope' has not been passed in `tools`.");
    const pattern = await bad(main, {
      tools: [{ type: "function", function: { name: "f", parameters: { type: "string", pattern: "^a" } } }],
      tool_choice: "required",
    });
    expect(pattern.param).toBe("tools.0.function.parameters");
    expect(pattern.message).toContain('keyword "pattern" is not supported');
  });
});

describe("response_format", () => {
  const SCHEMA = {
    type: "object",
    properties: {
      title: { type: "string", maxLength: 20 },
      tags: { type: "array", items: { type: "string" }, minItems: 1, maxItems: 3 },
      score: { type: "number", minimum: 0, maximum: 1 },
      status: { enum: ["draft", "final"] },
    },
    required: ["title", "tags", "score", "status"],
    additionalProperties: false,
  };

  it("json_object: a JSON object, counted as it re-tokenizes, streamed the same", async () => {
    const { plain: r, streamed } = await bothWays(main, {
      model: MODEL,
      messages: user("Describe the fleet as JSON."),
      response_format: { type: "json_object" },
      n: 2,
    });
    for (const [i, c] of r.choices.entries()) {
      const content = c.message.content!;
      expect(typeof JSON.parse(content)).toBe("object");
      expect(c.finish_reason).toBe("stop");
      expect(streamed.choices[i]!.content).toBe(content);
    }
    expect(r.usage!.completion_tokens).toBe(
      r.choices.reduce((n, c) => n + tokenize(c.message.content!).length, 0),
    );
  });

  it("json_schema: a value of the requested shape; completions too", async () => {
    const { plain: r } = await bothWays(main, {
      model: MODEL,
      messages: user("Summarise as JSON."),
      response_format: {
        type: "json_schema",
        json_schema: { name: "summary", schema: SCHEMA, strict: true },
      },
      n: 3,
    });
    for (const c of r.choices) expect(conforms(SCHEMA, JSON.parse(c.message.content!))).toBe(true);
    const before = await metrics(main);
    const comp = await main.client.completions.create({
      model: MODEL,
      prompt: "JSON:",
      max_tokens: 200,
      ...({ response_format: { type: "json_schema", json_schema: { name: "s", schema: SCHEMA } } } as object),
    });
    expect(conforms(SCHEMA, JSON.parse(comp.choices[0]!.text))).toBe(true);
    expect(comp.usage!.completion_tokens).toBe(tokenize(comp.choices[0]!.text).length);
    expect(counted(before, await metrics(main)).generation).toBe(comp.usage!.completion_tokens);
  });

  it("max_tokens truncates (finish_reason length, the JSON cut short)", async () => {
    const { plain: r, streamed } = await bothWays(main, {
      model: MODEL,
      messages: user("Summarise as JSON."),
      response_format: { type: "json_schema", json_schema: { name: "summary", schema: SCHEMA } },
      max_tokens: 5,
    });
    expect(r.choices[0]!.finish_reason).toBe("length");
    expect(() => JSON.parse(r.choices[0]!.message.content!)).toThrow();
    expect(streamed.choices[0]!.finish).toBe("length");
  });

  it("refuses a schema it cannot honour, and counts nothing for it", async () => {
    const before = await metrics(main);
    const err = await main.client.chat.completions
      .create({
        model: MODEL,
        messages: user("x"),
        response_format: {
          type: "json_schema",
          json_schema: {
            name: "s",
            schema: { type: "object", properties: { zip: { type: "string", pattern: "^\\d+$" } } },
          },
        },
      })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.param).toBe("response_format.json_schema.schema");
    expect(err.message).toContain(
      'keyword "pattern" is not supported by the sim engine (at /properties/zip)',
    );
    const other = await main.client.chat.completions
      .create({ model: MODEL, messages: user("x"), response_format: { type: "grammar" } as never })
      .catch((e) => e);
    expect(other.param).toBe("response_format.type");
    expect(counted(before, await metrics(main))).toMatchObject({ prompt: 0, generation: 0 });
  });
});

describe("logprobs", () => {
  it("chat: one entry per token, the tokens spelling the content, top_logprobs sorted; streamed the same", async () => {
    const { plain: r, streamed } = await bothWays(main, {
      model: MODEL,
      messages: user("Tell me something."),
      max_tokens: 10,
      logprobs: true,
      top_logprobs: 3,
      n: 2,
    });
    for (const [i, c] of r.choices.entries()) {
      const entries = c.logprobs!.content!;
      expect(entries).toHaveLength(10);
      expect(entries.map((e) => e.token).join("")).toBe(c.message.content);
      for (const e of entries) {
        expect(e.logprob).toBeLessThan(0);
        expect(e.bytes).toEqual([...Buffer.from(e.token)]);
        expect(e.top_logprobs).toHaveLength(3);
        const lps = e.top_logprobs.map((t) => t.logprob);
        expect(lps).toEqual([...lps].sort((a, b) => b - a));
        const listed = e.top_logprobs.find((t) => t.token === e.token);
        if (listed) expect(listed.logprob).toBe(e.logprob);
      }
      expect(streamed.choices[i]!.logprobs).toEqual(entries);
    }
    const bare = await main.client.chat.completions.create({
      model: MODEL,
      messages: user("x"),
      max_tokens: 2,
      logprobs: true,
    });
    expect(bare.choices[0]!.logprobs!.content!.every((e) => e.top_logprobs.length === 0)).toBe(true);
    const none = await main.client.chat.completions.create({
      model: MODEL,
      messages: user("x"),
      max_tokens: 2,
    });
    expect(none.choices[0]!.logprobs).toBeNull();
  });

  it("completions: tokens, token_logprobs, top_logprobs and text_offset, streamed the same", async () => {
    const body = { model: MODEL, prompt: "The edge", max_tokens: 6, logprobs: 2, temperature: 0 };
    const r = await main.client.completions.create(body);
    const lp = r.choices[0]!.logprobs!;
    expect(lp.tokens!.join("")).toBe(r.choices[0]!.text);
    expect(lp.token_logprobs).toHaveLength(6);
    expect(lp.text_offset).toEqual(lp.tokens!.map((_, k) => lp.tokens!.slice(0, k).join("").length));
    // Greedy: the sampled token is the most likely one.
    for (const [k, top] of lp.top_logprobs!.entries()) {
      expect(Object.keys(top)).toHaveLength(2);
      expect(Math.max(...Object.values(top))).toBe(lp.token_logprobs![k]);
    }
    const s = await main.client.completions.create({ ...body, stream: true });
    const tokens: string[] = [];
    for await (const chunk of s) for (const c of chunk.choices) tokens.push(...(c.logprobs?.tokens ?? []));
    expect(tokens).toEqual(lp.tokens);
  });

  it("refuses top_logprobs without logprobs, and above 20", async () => {
    const bad = async (body: Record<string, unknown>) =>
      main.client.chat.completions
        .create({ model: MODEL, messages: user("x"), ...body } as never)
        .catch((e) => e);
    const without = await bad({ top_logprobs: 2 });
    expect(without.message).toContain("when using `top_logprobs`, `logprobs` must be set to true.");
    expect((await bad({ logprobs: true, top_logprobs: 21 })).param).toBe("top_logprobs");
  });
});

describe("max_tokens", () => {
  it("0 is refused with the edge's message", async () => {
    for (const field of ["max_tokens", "max_completion_tokens"]) {
      const err = await main.client.chat.completions
        .create({ model: MODEL, messages: user("x"), [field]: 0 } as never)
        .catch((e) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect(err.param).toBe(field);
      expect(err.message).toContain(`${field}: must be at least 1, got 0`);
    }
  });
});
