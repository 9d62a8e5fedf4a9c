/**
 * The sim engine's n > 1, logprobs and max_tokens, against a real engine
 * process with the official `openai` client: each feature streamed and
 * not, the two usages equal, and both equal to what the engine's own
 * counters (vllm:prompt_tokens_total, vllm:generation_tokens_total) moved
 * by. Tools and response_format are in api-structured-output.test.ts.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tokenize } from "../../sim-engine/text.ts";
import { waitUntil } from "../harness/process.ts";
import {
  bothWays,
  counted,
  type Engine,
  engine,
  MODEL,
  metrics,
  rawStream,
  stopEngines,
  user,
} from "./features-harness.ts";

let main: Engine;
let _plain: Engine;
let hangMid: Engine;

beforeAll(async () => {
  [main, _plain, hangMid] = await Promise.all([
    engine("features", ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--seed", "4"]),
    engine("no-auto-tools", []),
    engine("hang-mid-n", ["--sim-hang-after", "0", "--sim-hang-phase", "mid-stream"]),
  ]);
});

afterAll(stopEngines);

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
