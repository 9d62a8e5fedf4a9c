import type { IncomingMessage } from "node:http";
import { PassThrough } from "node:stream";
import { describe, expect, it } from "vitest";
import { ChatStream } from "./chat-stream.ts";
import type { RequestResult } from "./stats.ts";

/** Reads `events` as one server's stream would arrive, and resolves with what the bench records. */
function readStream(body: string): Promise<RequestResult> {
  return new Promise((resolve) => {
    const res = Object.assign(new PassThrough(), {
      statusCode: 200,
      headers: { "content-type": "text/event-stream" },
    }) as unknown as IncomingMessage;
    const s = new ChatStream(
      { id: "r", at: 0, messages: [], maxTokens: 4 },
      { timeScale: 1, record: [] },
      resolve,
    );
    s.read(res);
    (res as unknown as PassThrough).end(body);
  });
}

const token = (t: string, finish: string | null = null) =>
  `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: t }, finish_reason: finish }] })}\n\n`;

describe("a streamed answer as the bench reads it", () => {
  it("counts the tokens of a clean stream", async () => {
    const r = await readStream(`${token("a")}${token("b", "stop")}data: [DONE]\n\n`);
    expect([r.ok, r.outputTokens]).toEqual([true, 2]);
  });

  it.each([
    ["data: null", "data: null\n\n"],
    ["choices not an array", 'data: {"choices":5}\n\n'],
    ["a choice that is null", 'data: {"choices":[null]}\n\n'],
    ["a delta that is a string", 'data: {"choices":[{"delta":"x"}]}\n\n'],
  ])("records %s as a bad event instead of throwing", async (_name, bad) => {
    const r = await readStream(`${token("a")}${bad}${token("b", "stop")}`);
    expect([r.ok, r.error]).toEqual([false, "bad event"]);
  });

  it("takes no token count that is not a number, counting the chunks instead", async () => {
    const usage = 'data: {"choices":[],"usage":{"prompt_tokens":"many","completion_tokens":"x"}}\n\n';
    const r = await readStream(`${token("a")}${usage}${token("b", "stop")}`);
    expect([r.ok, r.outputTokens, r.promptTokens]).toEqual([true, 2, undefined]);
  });
});
