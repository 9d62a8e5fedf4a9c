import { describe, expect, it } from "vitest";
import { ApiError } from "./protocol.ts";
import { ResponseWriter, responsesMessages } from "./responses.ts";

describe("responsesMessages", () => {
  it("a string input is one user message, after the instructions as a system message", () => {
    expect(responsesMessages("Be brief.", "Hello")).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hello" },
    ]);
    expect(responsesMessages(null, "")).toEqual([{ role: "user", content: "" }]);
  });

  it("items keep their roles and order; text parts are joined", () => {
    expect(
      responsesMessages(undefined, [
        { role: "developer", content: "Rules." },
        {
          type: "message",
          role: "user",
          content: [
            { type: "input_text", text: "a " },
            { type: "input_text", text: "b" },
          ],
        },
        { role: "assistant", content: [{ type: "output_text", text: "c", annotations: [] }] },
        { role: "system", content: "d" },
      ]),
    ).toEqual([
      { role: "developer", content: "Rules." },
      { role: "user", content: "a b" },
      { role: "assistant", content: "c" },
      { role: "system", content: "d" },
    ]);
  });

  const refusal = (input: unknown[]) => {
    try {
      responsesMessages(null, input);
    } catch (err) {
      expect(err).toBeInstanceOf(ApiError);
      const e = err as ApiError;
      return { status: e.status, param: e.param, message: e.message };
    }
    throw new Error("accepted");
  };

  it("refuses other items, parts and roles, naming where", () => {
    expect(
      refusal([
        { role: "user", content: "ok" },
        { type: "function_call", name: "f", arguments: "{}" },
      ]),
    ).toEqual({
      status: 400,
      param: "input.1.type",
      message:
        'input.1.type: input items of type "function_call" are not supported by the sim engine (only messages are)',
    });
    expect(
      refusal([{ role: "user", content: [{ type: "input_text", text: "a" }, { type: "input_image" }] }]),
    ).toEqual({
      status: 400,
      param: "input.0.content.1",
      message: 'content part type "input_image" is not supported by this model',
    });
    expect(refusal([{ role: "user", content: [{ type: "input_text" }] }]).param).toBe("input.0.content.0");
    expect(refusal([{ role: "tool", content: "x" }]).param).toBe("input.0.role");
    expect(refusal([{ role: "user" }])).toMatchObject({ param: "input.0.content" });
    expect(refusal(["just a string"]).param).toBe("input.0");
  });
});

describe("ResponseWriter", () => {
  const writer = () =>
    new ResponseWriter({
      id: "resp_1",
      itemId: "msg_1",
      created: 1700000000,
      model: "m",
      instructions: 'Be "brief".',
      maxOutputTokens: 2,
      temperature: 1,
      topP: 1,
    });
  const usage = { input: 5, cached: 0, output: 2 };

  it("a stream's events are numbered from 0 and parse as their own type", () => {
    const w = writer();
    const text =
      w.opening() + w.delta(" a", true) + w.delta(" b", false) + w.closing(" a b", "length", usage);
    const evs = text
      .split("\n\n")
      .filter(Boolean)
      .map((block) => {
        const [event, data] = block.split("\n");
        return { event: event!.slice("event: ".length), data: JSON.parse(data!.slice("data: ".length)) };
      });
    expect(evs.map((e) => e.data.sequence_number)).toEqual(evs.map((_, k) => k));
    for (const e of evs) expect(e.data.type).toBe(e.event);
    expect(evs.at(-1)!.data.response).toMatchObject({
      status: "incomplete",
      incomplete_details: { reason: "max_output_tokens" },
      instructions: 'Be "brief".',
      output: [{ status: "incomplete", content: [{ type: "output_text", text: " a b", annotations: [] }] }],
      usage: { input_tokens: 5, output_tokens: 2, total_tokens: 7 },
    });
  });

  it("the whole answer is complete when it ended by itself, usage its last key", () => {
    const body = JSON.parse(writer().body(" a", "stop", { input: 5, cached: 3, output: 1 }));
    expect(body.status).toBe("completed");
    expect(body.incomplete_details).toBeNull();
    expect(Object.keys(body).at(-1)).toBe("usage");
    expect(body.usage).toEqual({
      input_tokens: 5,
      input_tokens_details: { cached_tokens: 3 },
      output_tokens: 1,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 6,
    });
  });
});
