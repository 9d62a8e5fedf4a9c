import { describe, expect, it } from "vitest";
import { z } from "zod";
import { mulberry32 } from "../common/rng.ts";
import { planChoice } from "./choice-plan.ts";
import { checkSchema, SchemaError, sampleJsonObject, sampleSchema } from "./json-values.ts";
import { MAX_LOGPROBS, stepLogprobs } from "./logprobs.ts";
import { chatLogprob, completionLogprobs, toolCallDelta } from "./protocol.ts";
import { OUTPUT_VOCAB, planOutput, tokenize } from "./text.ts";
import { toolToCall } from "./tool-choice.ts";

/** zod's own JSON Schema reader is the independent judge of "conforms". */
const conforms = (schema: unknown, value: unknown) =>
  (z as unknown as { fromJSONSchema(s: unknown): z.ZodType }).fromJSONSchema(schema).safeParse(value).success;

const SCHEMAS: Record<string, Record<string, unknown>> = {
  "nested object, enums, bounds": {
    type: "object",
    properties: {
      city: { type: "string", minLength: 3, maxLength: 12 },
      unit: { enum: ["celsius", "fahrenheit"] },
      days: { type: "integer", minimum: 1, maximum: 7 },
      ratio: { type: "number", exclusiveMinimum: 0, exclusiveMaximum: 1 },
      step: { type: "integer", minimum: 10, maximum: 100, multipleOf: 15 },
      flag: { type: "boolean" },
      where: {
        type: "object",
        properties: { lat: { type: "number", minimum: -90, maximum: 90 }, kind: { const: "point" } },
        required: ["lat", "kind"],
        additionalProperties: false,
      },
    },
    required: ["city", "unit", "where"],
    additionalProperties: false,
  },
  "arrays: bounds, unique, tuples": {
    type: "object",
    properties: {
      tags: {
        type: "array",
        items: { enum: ["a", "b", "c", "d"] },
        minItems: 2,
        maxItems: 3,
        uniqueItems: true,
      },
      pair: { type: "array", prefixItems: [{ type: "string" }, { type: "integer" }], items: false },
      many: { type: "array", items: { type: "number" }, minItems: 4 },
    },
    required: ["tags", "pair", "many"],
  },
  "formats and type lists": {
    type: "object",
    properties: {
      at: { type: "string", format: "date-time" },
      day: { type: "string", format: "date" },
      mail: { type: "string", format: "email" },
      id: { type: "string", format: "uuid" },
      ip: { type: "string", format: "ipv4" },
      maybe: { type: ["integer", "null"], minimum: 0, maximum: 3 },
    },
    required: ["at", "day", "mail", "id", "ip", "maybe"],
  },
  "refs, recursion, combinators": {
    $defs: {
      node: {
        type: "object",
        properties: {
          name: { type: "string" },
          children: { type: "array", items: { $ref: "#/$defs/node" } },
        },
        required: ["name"],
      },
    },
    type: "object",
    properties: {
      tree: { $ref: "#/$defs/node" },
      either: {
        anyOf: [
          { type: "string", maxLength: 5 },
          { type: "integer", minimum: 100, maximum: 200 },
        ],
      },
      one: { oneOf: [{ type: "boolean" }, { type: "null" }] },
      both: {
        allOf: [
          { type: "object", properties: { a: { type: "integer" } }, required: ["a"] },
          { properties: { b: { type: "string" } }, required: ["b"] },
        ],
      },
    },
    required: ["tree", "either", "one", "both"],
  },
};

describe("JSON values from a schema", () => {
  it.each(Object.entries(SCHEMAS))("conform for 200 seeds: %s", (_name, schema) => {
    checkSchema(schema);
    for (let seed = 0; seed < 200; seed++) {
      const v = sampleSchema(schema, mulberry32(seed));
      expect(conforms(schema, v), `seed ${seed}: ${JSON.stringify(v)}`).toBe(true);
    }
    expect(sampleSchema(schema, mulberry32(7))).toEqual(sampleSchema(schema, mulberry32(7)));
  });

  it("merges allOf (zod's reader does not check it)", () => {
    const schema = SCHEMAS["refs, recursion, combinators"]!;
    for (let seed = 0; seed < 50; seed++) {
      const v = sampleSchema(schema, mulberry32(seed)) as { both: { a: unknown; b: unknown } };
      expect(Number.isInteger(v.both.a)).toBe(true);
      expect(typeof v.both.b).toBe("string");
    }
  });

  it("refuses a schema whose least value is too big to build, before building it", () => {
    expect(() => checkSchema({ type: "array", minItems: 1e8 })).toThrow(/minItems above 100000/);
    expect(() => checkSchema({ type: "string", minLength: 1e9 })).toThrow(/minLength above 100000/);
    const nested = { type: "array", minItems: 100, items: { type: "array", minItems: 100, items: {} } };
    const deep = { type: "array", minItems: 100, items: nested };
    expect(() => sampleSchema(deep, mulberry32(1))).toThrow(SchemaError);
    expect(() => sampleSchema(deep, mulberry32(1))).toThrow(/more than 100000 parts/);
    expect(
      (sampleSchema({ type: "string", minLength: 20_000 }, mulberry32(1)) as string).length,
    ).toBeGreaterThanOrEqual(20_000);
  });

  it("refuses what it cannot honour, naming where", () => {
    const refuse = (schema: unknown) => {
      try {
        checkSchema(schema);
      } catch (err) {
        expect(err).toBeInstanceOf(SchemaError);
        return (err as Error).message;
      }
      throw new Error("accepted");
    };
    expect(refuse({ type: "object", properties: { zip: { type: "string", pattern: "^[0-9]{5}$" } } })).toBe(
      'keyword "pattern" is not supported by the sim engine (at /properties/zip)',
    );
    expect(refuse({ not: { type: "string" } })).toMatch(/"not"/);
    expect(refuse({ $ref: "https://example.com/s.json" })).toMatch(/only local \$refs/);
    expect(refuse({ $ref: "#/$defs/missing" })).toMatch(/does not resolve/);
    expect(refuse({ type: "text" })).toMatch(/unknown type "text"/);
    expect(refuse({ type: "array", items: { enum: [] } })).toMatch(
      /enum must be a non-empty array \(at \/items\)/,
    );
    // Annotations and unknown keywords are ignored.
    expect(() =>
      checkSchema({ type: "string", title: "t", description: "d", "x-extension": 1 }),
    ).not.toThrow();
  });

  it("says so when a schema admits no value", () => {
    expect(() => sampleSchema({ type: "integer", minimum: 5, maximum: 4 }, mulberry32(1))).toThrow(
      SchemaError,
    );
    expect(() =>
      sampleSchema({ type: "object", required: ["a"], additionalProperties: false }, mulberry32(1)),
    ).toThrow(/required property "a"/);
    const endless = {
      $defs: { n: { type: "object", properties: { n: { $ref: "#/$defs/n" } }, required: ["n"] } },
      $ref: "#/$defs/n",
    };
    expect(() => sampleSchema(endless, mulberry32(1))).toThrow(/deeper than/);
  });

  it("json_object: an object of at least the target length, close to it", () => {
    for (const target of [1, 20, 128, 500]) {
      const text = JSON.stringify(sampleJsonObject(mulberry32(target), target));
      const n = tokenize(text).length;
      expect(n).toBeGreaterThanOrEqual(target);
      expect(n).toBeLessThan(target + 40);
      expect(typeof JSON.parse(text)).toBe("object");
    }
  });
});

describe("choice plans", () => {
  const prompt = [1, 2, 3, 4];
  const text = (p: ReturnType<typeof planChoice>, n = p.naturalLength) =>
    Array.from({ length: n }, (_, i) => p.pieceAt(i, p.tokenAt(i))).join("");

  it("text: choice 0 is what n=1 says, other choices say something else, deterministically", () => {
    const one = planOutput(9, prompt, 64);
    const c0 = planChoice(9, prompt, 64, 0, { kind: "text" }, false);
    const c1 = planChoice(9, prompt, 64, 1, { kind: "text" }, false);
    expect(c0.naturalLength).toBe(one.naturalLength);
    expect(c0.tokenAt(5)).toBe(one.tokenAt(5));
    expect(text(c1, 30)).not.toBe(text(c0, 30));
    expect(text(planChoice(9, prompt, 64, 1, { kind: "text" }, false), 30)).toBe(text(c1, 30));
    expect(planChoice(9, prompt, 64, 0, { kind: "text" }, true).naturalLength).toBe(Number.POSITIVE_INFINITY);
  });

  it("structured: the whole value, cut into the tokenizer's pieces, ending with the value", () => {
    const schema = SCHEMAS["nested object, enums, bounds"]!;
    for (const shape of [
      { kind: "json_object" } as const,
      { kind: "json_schema", schema } as const,
      { kind: "tool", name: "get_weather", parameters: schema } as const,
    ]) {
      for (let choice = 0; choice < 3; choice++) {
        const p = planChoice(3, prompt, 40, choice, shape, true);
        const out = text(p);
        expect(tokenize(out).length).toBe(p.naturalLength);
        expect(tokenize(out)).toEqual(Array.from({ length: p.naturalLength }, (_, i) => p.tokenAt(i)));
        const value = JSON.parse(out);
        if (shape.kind !== "json_object") expect(conforms(schema, value)).toBe(true);
        // A prefix (max_tokens) re-tokenizes to its own length too.
        expect(tokenize(text(p, 7)).length).toBe(7);
      }
      const a = text(planChoice(3, prompt, 40, 0, shape, false));
      const b = text(planChoice(3, prompt, 40, 1, shape, false));
      expect(a).not.toBe(b);
    }
    expect(planChoice(3, prompt, 40, 0, { kind: "tool", name: "f", parameters: null }, false).toolName).toBe(
      "f",
    );
    expect(text(planChoice(3, prompt, 40, 0, { kind: "tool", name: "f", parameters: null }, false))).toBe(
      "{}",
    );
  });
});

describe("tool choice", () => {
  const tools = [{ name: "get_weather" }, { name: "search_docs" }, { name: "Weather" }];
  const user = (text: string) => ({ role: "user", text });

  it("follows the documented rule", () => {
    expect(toolToCall(tools, "none", user("get_weather please"))).toBeUndefined();
    expect(toolToCall([], "required", user("x"))).toBeUndefined();
    expect(toolToCall(tools, { type: "function", function: { name: "search_docs" } }, user("x"))?.name).toBe(
      "search_docs",
    );
    expect(toolToCall(tools, "auto", user("Please SEARCH_DOCS for it"))?.name).toBe("search_docs");
    // Several mentioned: the first in `tools` order.
    expect(toolToCall(tools, "auto", user("weather via get_weather"))?.name).toBe("get_weather");
    expect(toolToCall(tools, "auto", user("nothing relevant"))).toBeUndefined();
    expect(toolToCall(tools, "auto", { role: "tool", text: "get_weather: 21C" })).toBeUndefined();
    expect(toolToCall(tools, "required", user("nothing relevant"))?.name).toBe("get_weather");
    expect(toolToCall(tools, "required", user("use search_docs"))?.name).toBe("search_docs");
  });

  it("streams a call as vLLM does: id, type and name first, then argument fragments", () => {
    const head = JSON.parse(toolCallDelta({ id: "chatcmpl-tool-1", name: "f" }, "{"));
    const next = JSON.parse(toolCallDelta(null, '"a"'));
    expect(head).toEqual({
      tool_calls: [
        { id: "chatcmpl-tool-1", type: "function", index: 0, function: { name: "f", arguments: "{" } },
      ],
    });
    expect(next).toEqual({ tool_calls: [{ index: 0, function: { arguments: '"a"' } }] });
  });
});

describe("synthetic logprobs", () => {
  it("are negative, sorted, a sub-distribution, and agree with the sampled token", () => {
    for (let i = 0; i < 300; i++) {
      const s = stepLogprobs(11, i, " GPU", MAX_LOGPROBS, false);
      expect(s.token).toBe(" GPU");
      expect(s.logprob).toBeLessThan(0);
      const lps = s.top.map((t) => t.logprob);
      expect(lps).toEqual([...lps].sort((a, b) => b - a));
      expect(lps.reduce((sum, lp) => sum + Math.exp(lp), 0)).toBeLessThan(1);
      expect(new Set(s.top.map((t) => t.token)).size).toBe(MAX_LOGPROBS);
      const listed = s.top.find((t) => t.token === " GPU")!;
      expect(listed.logprob).toBe(s.logprob);
      expect(s.top.indexOf(listed)).toBeLessThan(5);
      expect(s.top.every((t) => OUTPUT_VOCAB.includes(t.token))).toBe(true);
    }
  });

  it("are the same for the same token, grow without changing their head, and are greedy at temperature 0", () => {
    expect(stepLogprobs(5, 3, " a", 4, false)).toEqual(stepLogprobs(5, 3, " a", 4, false));
    expect(stepLogprobs(5, 3, " a", 7, false).top.slice(0, 4)).toEqual(
      stepLogprobs(5, 3, " a", 4, false).top,
    );
    expect(stepLogprobs(5, 3, " a", 0, false).top).toEqual([]);
    let ranked = 0;
    for (let i = 0; i < 200; i++) {
      expect(stepLogprobs(5, i, " a", 3, true).top[0]!.token).toBe(" a");
      if (stepLogprobs(5, i, " a", 5, false).top[0]!.token !== " a") ranked++;
    }
    // Sampling at temperature > 0 sometimes takes a token that was not the most likely.
    expect(ranked).toBeGreaterThan(20);
  });

  it("render in OpenAI's shapes: chat content entries, completion arrays", () => {
    const s = stepLogprobs(1, 0, "é", 2, true);
    const chat = JSON.parse(chatLogprob(s));
    expect(chat).toEqual({
      token: "é",
      logprob: s.logprob,
      bytes: [0xc3, 0xa9],
      top_logprobs: s.top.map((t) => ({
        token: t.token,
        logprob: t.logprob,
        bytes: [...Buffer.from(t.token)],
      })),
    });
    const rare = stepLogprobs(1, 0, " x", 0, false);
    const comp = JSON.parse(completionLogprobs([{ step: rare, offset: 4 }]));
    // k = 0: just the sampled token, as OpenAI documents "up to logprobs + 1".
    expect(comp).toEqual({
      text_offset: [4],
      token_logprobs: [rare.logprob],
      tokens: [" x"],
      top_logprobs: [{ " x": rare.logprob }],
    });
  });
});
