/**
 * The edge's usage reader on the chunk shapes the sim engine (after vLLM)
 * writes for n > 1, tool-call deltas and logprobs: its byte path, its
 * substring path and its JSON path must agree on what to forward and on the
 * usage, and with n > 1 the usage so far is the sum of each choice's latest
 * count (vLLM's continuous stats count per choice), until the final total.
 */
import { describe, expect, it } from "vitest";
import { stepLogprobs } from "../../sim-engine/logprobs.ts";
import {
  chatChunks,
  chatLogprob,
  chatLogprobs,
  completionChunks,
  completionLogprobs,
  contentDelta,
  toolCallDelta,
  usageJson,
} from "../../sim-engine/protocol.ts";
import { StreamUsage } from "./sse-usage.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();
const PROMPT = 40;
const u = (completion: number) => usageJson({ prompt: PROMPT, completion }, false);
const lp = (i: number, token: string) => stepLogprobs(7, i, token, 3, false);

/** A chat stream of two choices: 0 answers in text with logprobs, 1 calls a tool. Continuous usage. */
function chatStream(): string[] {
  const w = chatChunks("chatcmpl-x", 1, "m", "continuous");
  const out = [w.role(0, u(0)), w.role(1, u(0))];
  const text = [" the", " GPU", ' "usage":{}', "."];
  const args = ['{"', "city", '":"', " Paris", '"}'];
  for (let i = 0; i < 5; i++) {
    if (i < text.length) {
      const entry = chatLogprobs([chatLogprob(lp(i, text[i]!))]);
      out.push(w.token(0, contentDelta(text[i]!), entry, i === text.length - 1 ? "stop" : null, u(i + 1)));
    }
    const head = i === 0 ? { id: "chatcmpl-tool-1", name: "get_weather" } : null;
    out.push(w.token(1, toolCallDelta(head, args[i]!), null, i === 4 ? "tool_calls" : null, u(i + 1)));
  }
  out.push(w.usage(u(9)));
  return out;
}

function completionStream(): string[] {
  const w = completionChunks("cmpl-x", 1, "m", "continuous");
  const out: string[] = [];
  for (let i = 0; i < 3; i++) {
    for (const c of [0, 1]) {
      const text = c === 0 ? " a" : " b";
      const logprobs = completionLogprobs([{ step: lp(i, text), offset: i * 2 }]);
      out.push(w.token(c, JSON.stringify(text), logprobs, i === 2 ? "length" : null, u(i + 1)));
    }
  }
  out.push(w.usage(u(6)));
  return out;
}

/** The same event forced off both fast paths (a space after the key), onto the JSON round trip. */
const viaJson = (chunk: string) => chunk.slice(0, -2).replace(',"usage":', ', "usage":');

describe.each([
  ["chat: text with logprobs beside a streamed tool call", chatStream(), 9],
  ["completions: two choices with logprobs", completionStream(), 6],
])("%s", (_name, stream, total) => {
  it.each(["none", "final", "continuous"] as const)("the three paths agree, mode %s", (mode) => {
    const bytes = new StreamUsage(mode);
    const text = new StreamUsage(mode);
    const json = new StreamUsage(mode);
    for (const c of stream) {
      const want = text.event(c.slice(0, -2));
      const finish = c.includes('"finish_reason":"');
      const got = bytes.chunk(enc.encode(c));
      // Finish chunks are read whole, on the text path; every other chunk stays on the byte path.
      expect(got === undefined, c).toBe(finish);
      expect(got ? dec.decode(got) : bytes.event(c.slice(0, -2))).toBe(want);
      const round = json.event(viaJson(c));
      if (want === "") expect(round).toBe("");
      else expect(JSON.parse(round.slice(6))).toEqual(JSON.parse(want.slice(6)));
    }
    for (const t of [bytes, text, json]) {
      expect(t.usage).toEqual({
        prompt_tokens: PROMPT,
        completion_tokens: total,
        total_tokens: PROMPT + total,
      });
      expect(t.dataEvents).toBe(stream.length - 1);
    }
  });

  it("cut before the final chunk, the usage so far is the sum of each choice's latest", () => {
    for (let cut = 1; cut < stream.length; cut++) {
      const t = new StreamUsage("none");
      const latest = new Map<number, number>();
      for (const c of stream.slice(0, cut)) {
        if (!t.chunk(enc.encode(c))) t.event(c.slice(0, -2));
        const obj = JSON.parse(c.slice(6));
        latest.set(obj.choices[0].index, obj.usage.completion_tokens);
      }
      const sum = [...latest.values()].reduce((a, b) => a + b, 0);
      expect(t.usage, `after ${cut} chunks`).toEqual({
        prompt_tokens: PROMPT,
        completion_tokens: sum,
        total_tokens: PROMPT + sum,
      });
    }
  });
});

describe("usage per choice, other layouts", () => {
  it("takes the final total over the per-choice counts, and one choice alone as before", () => {
    const w = chatChunks("c", 1, "m", "continuous");
    const t = new StreamUsage("final");
    t.event(w.token(0, contentDelta("a"), null, null, u(3)).slice(0, -2));
    t.event(w.token(1, contentDelta("b"), null, null, u(2)).slice(0, -2));
    expect(t.usage?.completion_tokens).toBe(5);
    t.event(w.usage(u(7)).slice(0, -2));
    expect(t.usage?.completion_tokens).toBe(7);
    const one = new StreamUsage("none");
    one.chunk(enc.encode(w.token(0, contentDelta("a"), null, null, u(1))));
    one.chunk(enc.encode(w.token(0, contentDelta("b"), null, null, u(2))));
    expect(one.usage?.completion_tokens).toBe(2);
  });

  it("finds the choice index again when the chunk layout moves", () => {
    const short = chatChunks("c", 1, "m", "continuous");
    const long = chatChunks("chatcmpl-a-much-longer-id", 1, "a/longer-model", "continuous");
    const t = new StreamUsage("none");
    expect(t.chunk(enc.encode(short.token(0, contentDelta("a"), null, null, u(3))))).toBeDefined();
    expect(t.chunk(enc.encode(long.token(12, contentDelta("b"), null, null, u(4))))).toBeDefined();
    expect(t.chunk(enc.encode(short.token(1, contentDelta("c"), null, null, u(5))))).toBeDefined();
    expect(t.usage?.completion_tokens).toBe(12);
  });

  it("leaves a usage chunk whose choice index it cannot find to the text path", () => {
    const odd = `data: {"id":"c","choices":[{"delta":{"content":"x"},"index":1}],"usage":${u(4)}}\n\n`;
    const t = new StreamUsage("none");
    expect(t.chunk(enc.encode(odd))).toBeUndefined();
    expect(JSON.parse(t.event(odd.slice(0, -2)).slice(6))).toEqual({
      id: "c",
      choices: [{ delta: { content: "x" }, index: 1 }],
    });
    expect(t.usage?.completion_tokens).toBe(4);
  });
});
