import { describe, expect, it } from "vitest";
import { SseSplitter } from "../../common/sse.ts";
import { estimateTokens } from "../keys/reservations.ts";
import { chatViewOf } from "../routing/conversation.ts";
import { predictDemand, promptTokens } from "../routing/demand.ts";
import { promptText, requestPrefixHashes } from "../routing/prefix-hash.ts";
import { ResponseEvents } from "./response-events.ts";
import { answerText } from "./usage-estimate.ts";

/** A Responses stream as vLLM writes one: `event: <type>` and the same `type` in compact JSON. */
const ev = (type: string, fields: Record<string, unknown> = {}) =>
  `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: 0, ...fields })}\n\n`;
const response = (status: string, usage: unknown = null) => ({
  id: "resp_1",
  object: "response",
  status,
  output: [],
  usage,
});
const usage = {
  input_tokens: 9,
  input_tokens_details: { cached_tokens: 0 },
  output_tokens: 3,
  total_tokens: 12,
};
const opening = [
  ev("response.created", { response: response("in_progress") }),
  ev("response.in_progress", { response: response("in_progress") }),
  ev("response.output_item.added", { output_index: 0, item: { id: "msg_1", type: "message", content: [] } }),
  ev("response.content_part.added", { item_id: "msg_1", output_index: 0, content_index: 0, part: {} }),
];
const deltas = ["Hel", "lo", "!"].map((delta) =>
  ev("response.output_text.delta", { item_id: "msg_1", output_index: 0, content_index: 0, delta }),
);
const closing = [
  ev("response.output_text.done", { item_id: "msg_1", text: "Hello!" }),
  ev("response.output_item.done", { output_index: 0, item: { id: "msg_1", type: "message" } }),
  ev("response.completed", { response: response("completed", usage) }),
];

function read(events: string[]): { t: ResponseEvents; out: string[] } {
  const t = new ResponseEvents();
  const splitter = new SseSplitter();
  const out: string[] = [];
  for (const e of splitter.push(events.join(""))) out.push(t.event(e));
  return { t, out };
}

describe("a Responses API stream", () => {
  it("has its first token at the first delta: the events announcing the answer come before it", () => {
    const { t } = read(opening);
    expect(t.dataEvents).toBe(0);
    expect(read([...opening, deltas[0]!]).t.dataEvents).toBe(1);
  });

  it("relays every event as it came, is complete at response.completed, and reads its usage there", () => {
    const all = [...opening, ...deltas, ...closing];
    const { t, out } = read(all);
    expect(out.join("")).toBe(all.join(""));
    expect(t.done).toBe(true);
    expect(t.complete()).toBe(true);
    expect(t.usage).toEqual({ prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 });
    // No [DONE]: the Responses API has none.
    expect(t.closing()).toBe("");
    expect(t.error).toBeUndefined();
  });

  it("is complete at response.incomplete too (the length limit), with its usage", () => {
    const { t } = read([
      ...opening,
      ...deltas,
      ev("response.incomplete", { response: response("incomplete", usage) }),
    ]);
    expect(t.done).toBe(true);
    expect(t.usage?.completion_tokens).toBe(3);
  });

  it("counts a cut stream's text for an estimate, and knows whether an output item had finished", () => {
    const { t } = read([...opening, ...deltas]);
    expect(t.done).toBe(false);
    expect(t.usage).toBeUndefined();
    expect(t.relayed).toEqual({ chars: 6, chunks: 3 });
    expect(t.finished.size).toBe(0);
    expect(read([...opening, ...deltas, closing[0]!, closing[1]!]).t.finished.size).toBe(1);
  });

  it("takes an engine's error event as its error, in the shape openai-node throws on", () => {
    const { t, out } = read([
      ...opening,
      ev("error", { code: "server_error", message: "the engine died", param: null }),
    ]);
    expect(t.error).toMatchObject({ message: "the engine died", code: "server_error" });
    const last = out.at(-1)!;
    expect(last.startsWith("event: error\ndata: ")).toBe(true);
    const data = JSON.parse(last.slice("event: error\ndata: ".length)) as Record<string, unknown>;
    expect(data).toMatchObject({ type: "error", code: "server_error", message: "the engine died" });
    expect(data.error).toMatchObject({ message: "the engine died" });
  });

  it("takes response.failed as the engine's error, and forwards it as it came", () => {
    const failed = ev("response.failed", {
      response: { ...response("failed"), error: { code: "server_error", message: "out of memory" } },
    });
    const { t, out } = read([...opening, failed]);
    expect(t.error).toMatchObject({ message: "out of memory", code: "server_error" });
    expect(out.at(-1)).toBe(failed);
    expect(t.done).toBe(false);
  });
});

describe("a Responses API request's estimates", () => {
  const body = {
    model: "m",
    instructions: "Be brief.",
    input: [
      { role: "user", content: "What is a GPU?" },
      { type: "message", role: "assistant", content: [{ type: "output_text", text: "A processor." }] },
      { type: "function_call", name: "count_gpus", arguments: "{}", call_id: "c1" },
      { type: "function_call_output", call_id: "c1", output: "8" },
      { role: "user", content: [{ type: "input_text", text: "And a TPU?" }] },
    ],
    max_output_tokens: 50,
    // Chat's fields: a Responses engine reads neither.
    max_tokens: 1,
    n: 0,
  };
  // The chat request it stands for, written out.
  const chat = {
    model: "m",
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "What is a GPU?" },
      { role: "assistant", content: [{ type: "output_text", text: "A processor." }] },
      { role: "function_call", content: "count_gpus\n{}" },
      { role: "function_call_output", content: "8" },
      { role: "user", content: [{ type: "input_text", text: "And a TPU?" }] },
    ],
    max_tokens: 50,
  };

  it("reads instructions, input items and max_output_tokens as the chat request with those messages", () => {
    const view = chatViewOf(body);
    expect(view).toEqual({ messages: chat.messages, max_tokens: 50 });
    expect(promptTokens(view)).toBe(promptTokens(chat));
    expect(promptText(view)).toBe(promptText(chat));
  });

  it("bounds admission and the key's reservation by max_output_tokens alone", () => {
    const view = chatViewOf(body);
    expect(predictDemand(view, true, 300).outputTokens).toBe(50);
    expect(estimateTokens(view, 400, true)).toBe(450);
    // None named: the assumption, as for chat.
    expect(
      predictDemand(chatViewOf({ model: "m", input: "hi", max_tokens: 1 }), true, 300).outputTokens,
    ).toBe(300);
  });

  it("hashes a conversation's first turn the same whether it came as a string or as an item", () => {
    const first = "Tell me a story about a fleet of GPUs. ".repeat(4);
    const asString = requestPrefixHashes("m", chatViewOf({ model: "m", input: first }));
    const next = requestPrefixHashes(
      "m",
      chatViewOf({
        model: "m",
        input: [
          { role: "user", content: first },
          { role: "assistant", content: "Once upon a time…" },
          { role: "user", content: "Go on." },
        ],
      }),
    );
    expect(asString.length).toBeGreaterThan(1);
    expect(next.slice(0, asString.length - 1)).toEqual(asString.slice(0, -1));
  });

  it("estimates a whole response's answer from its output items when it carries no usage", () => {
    const answer = {
      output: [
        { type: "message", content: [{ type: "output_text", text: "Hello there" }] },
        { type: "function_call", name: "f", arguments: '{"a":1}' },
      ],
    };
    expect(answerText(answer)).toEqual({ chars: 18, chunks: 0 });
  });
});
