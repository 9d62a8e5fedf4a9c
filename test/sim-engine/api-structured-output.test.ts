/**
 * The sim engine's tools and response_format, against a real engine
 * process with the official `openai` client: the output matches the
 * schema asked for, streamed and not, with usages equal to what the
 * engine's counters moved by; what vLLM refuses is refused.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tokenize } from "../../sim-engine/text.ts";
import {
  bothWays,
  conforms,
  counted,
  type Engine,
  engine,
  MODEL,
  metrics,
  SEARCH,
  stopEngines,
  user,
  WEATHER,
} from "./features-harness.ts";

let main: Engine;
let plain: Engine;

beforeAll(async () => {
  [main, plain] = await Promise.all([
    engine("features", ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--seed", "4"]),
    engine("no-auto-tools", []),
  ]);
});

afterAll(stopEngines);

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
