import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type Edge,
  keyUsage,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
} from "./helpers.ts";

/**
 * OpenAI's Responses API through the edge in workerd, in front of sim
 * engines that serve it as vLLM does, driven by the openai client's
 * `responses.create`: answers streamed and not, each charged to its key
 * exactly what the engine's usage says; a stream cut by a dying engine
 * raises an APIError and is charged more than nothing; a bad body is the
 * edge's 400; a stored response is nothing the gateway can find.
 */
afterAll(stopStarted);

describe("the Responses API at the edge", () => {
  let edge: Edge;

  beforeAll(async () => {
    const [e, sim, dying] = await Promise.all([
      startEdge(),
      startSim("resp", ["--sim-speed", "50"]),
      startSim("resp-cut", ["--sim-crash-after", "0", "--sim-speed", "5"]),
    ]);
    edge = e as Edge;
    await setEndpoints(edge, [
      { id: "resp-0", url: (sim as { url: string }).url, models: ["resp"] },
      { id: "resp-cut-0", url: (dying as { url: string }).url, models: ["resp-cut"] },
    ]);
  }, 120_000);

  /** A key of its own, and its usage once `requests` requests have been charged. */
  async function keyed() {
    const key = await createKey(edge);
    const charged = (requests: number) =>
      waitUntil(
        `${requests} request(s) charged`,
        async () => {
          const u = await keyUsage(edge, key.id).catch(() => undefined);
          return u && u.requests === requests ? u : undefined;
        },
        15_000,
      );
    return { client: clientFor(edge, key.secret), charged, secret: key.secret };
  }

  it("answers a non-streamed request and charges the key the response's usage", async () => {
    const { client, charged } = await keyed();
    const { data, response } = await client.responses
      .create({ model: "resp", input: "Tell me about GPUs.", max_output_tokens: 8 })
      .withResponse();
    expect(response.headers.get("x-llmgw-endpoint")).toBe("resp-0");
    expect(data.output_text.length).toBeGreaterThan(0);
    expect(data.usage?.output_tokens).toBe(8);
    const u = await charged(1);
    expect([u.prompt, u.completion, u.estimatedRequests]).toEqual([data.usage!.input_tokens, 8, 0]);
  });

  it("streams instructions and a conversation event for event, and charges response.completed's usage", async () => {
    const { client, charged } = await keyed();
    const stream = await client.responses.create({
      model: "resp",
      instructions: "Answer briefly.",
      input: [
        { role: "user", content: "What is a GPU?" },
        { role: "assistant", content: "A processor for parallel work." },
        { role: "user", content: [{ type: "input_text", text: "And how many do we have?" }] },
      ],
      max_output_tokens: 12,
      stream: true,
    });
    const types: string[] = [];
    let text = "";
    let completed: OpenAI.Responses.Response | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.completed") completed = event.response;
    }
    expect(types[0]).toBe("response.created");
    expect(types.at(-1)).toBe("response.completed");
    expect(types.filter((t) => t === "response.output_text.delta").length).toBeGreaterThan(0);
    expect(completed?.output_text ?? text).toBe(text);
    expect(completed?.usage?.output_tokens).toBe(12);
    const u = await charged(1);
    expect([u.prompt, u.completion, u.estimatedRequests]).toEqual([completed!.usage!.input_tokens, 12, 0]);
  });

  it("ends a stream with the engine's last event and no [DONE]", async () => {
    const { secret } = await keyed();
    const r = await fetch(`${edge.url}/v1/responses`, {
      method: "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "resp", input: "hi", max_output_tokens: 4, stream: true }),
    });
    expect(r.headers.get("content-type")).toContain("text/event-stream");
    const text = await r.text();
    expect(text).not.toContain("[DONE]");
    expect(text.trimEnd().split("\n\n").at(-1)).toMatch(/^event: response\.completed\ndata: \{/);
  });

  it("raises an APIError for a stream cut by the engine dying, and charges it more than nothing", async () => {
    const { client, charged } = await keyed();
    const stream = await client.responses.create({
      model: "resp-cut",
      input: "Tell me a long story.",
      max_output_tokens: 200,
      stream: true,
    });
    let deltas = 0;
    const err = await (async () => {
      for await (const event of stream) if (event.type === "response.output_text.delta") deltas++;
    })().catch((e: unknown) => e);
    expect(deltas).toBeGreaterThanOrEqual(1);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const u = await charged(1);
    expect(u.partial).toBe(1);
    expect(u.prompt).toBeGreaterThan(0);
    expect(u.completion).toBeGreaterThan(0);
  });

  it("refuses a body it cannot route with a 400 that names the field", async () => {
    const { client } = await keyed();
    const refused = async (body: Record<string, unknown>) => {
      const e = await client.responses.create(body as never).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(OpenAI.BadRequestError);
      return e as InstanceType<typeof OpenAI.BadRequestError>;
    };
    expect((await refused({ model: "resp" })).message).toContain("input: is required");
    const zero = await refused({ model: "resp", input: "hi", max_output_tokens: 0 });
    expect(zero.param).toBe("max_output_tokens");
    expect(zero.message).toContain("must be at least 1, got 0");
  });

  it("keeps no responses: one cannot be retrieved, and the 404 says why", async () => {
    const { client } = await keyed();
    const e = await client.responses.retrieve("resp_123").catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OpenAI.NotFoundError);
    expect((e as Error).message).toContain("keeps no responses");
  });
});
