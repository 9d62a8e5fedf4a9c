import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type Edge,
  engineCounters,
  keyUsage,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * /v1/embeddings end to end: the official openai client, the edge in
 * workerd, a real sim engine. Vectors, the key's charges against the
 * engine's own counters, and OpenAI-shaped 400s from the edge and from the
 * engine.
 */
const DIM = 384; // the sim engine's embedding size (docs/sim-engine.md)

const norm = (v: readonly number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

describe("embeddings through the edge", () => {
  let edge: Edge;
  let sim: Sim;
  let key: TestKey;
  let client: OpenAI;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([startEdge(), startSim("embedder")]);
    await setEndpoints(edge, [{ id: "embedder-1", url: sim.url, models: ["embedder"] }]);
    // No limits: its charges are batched (flushed about once a second), so usage is polled.
    key = await createKey(edge);
    client = clientFor(edge, key.secret);
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  /** Waits for the key's ledger to show `prompt` tokens over `requests` requests. */
  async function charged(requests: number, prompt: number) {
    await waitUntil(
      `the key charged ${prompt} prompt tokens over ${requests} requests`,
      async () => {
        const u = await keyUsage(edge, key.id);
        return u.requests >= requests && u.prompt >= prompt;
      },
      15_000,
      50,
    );
    return keyUsage(edge, key.id);
  }

  it("returns unit vectors, charges the key exactly the engine's prompt tokens", async () => {
    const before = await engineCounters(sim);
    const texts = ["The edge routes each request.", "Bananas are yellow.", "The edge routes each request."];

    // The client asks for base64 and decodes it to float32 itself.
    const { data: batch, response } = await client.embeddings
      .create({ model: "embedder", input: texts })
      .withResponse();
    expect(response.headers.get("x-llmgw-endpoint")).toBe("embedder-1");
    expect(batch.object).toBe("list");
    expect(batch.model).toBe("embedder");
    expect(batch.data.map((d) => [d.index, d.object])).toEqual([
      [0, "embedding"],
      [1, "embedding"],
      [2, "embedding"],
    ]);
    for (const d of batch.data) {
      expect(d.embedding).toHaveLength(DIM);
      expect(norm(d.embedding)).toBeCloseTo(1, 5);
    }
    expect(batch.data[2]!.embedding).toEqual(batch.data[0]!.embedding);
    expect(batch.data[1]!.embedding).not.toEqual(batch.data[0]!.embedding);
    expect(batch.usage.total_tokens).toBe(batch.usage.prompt_tokens);

    // Floats as JSON are the same float32 values; `dimensions` cuts and renormalises.
    const floats = await client.embeddings.create({
      model: "embedder",
      input: texts[0]!,
      encoding_format: "float",
    });
    expect(floats.data[0]!.embedding).toEqual(batch.data[0]!.embedding);
    const small = await client.embeddings.create({ model: "embedder", input: "short", dimensions: 32 });
    expect(small.data[0]!.embedding).toHaveLength(32);
    expect(norm(small.data[0]!.embedding)).toBeCloseTo(1, 5);

    // Token ids: BOS + ids, as a completion counts them.
    const ids = await client.embeddings.create({ model: "embedder", input: [[1, 2, 3], [4]] });
    expect(ids.data).toHaveLength(2);
    expect(ids.usage.prompt_tokens).toBe(4 + 2);

    const answered =
      batch.usage.prompt_tokens +
      floats.usage.prompt_tokens +
      small.usage.prompt_tokens +
      ids.usage.prompt_tokens;
    const after = await engineCounters(sim);
    expect(after.prompt - before.prompt).toBe(answered);
    expect(after.generation).toBe(before.generation);
    expect(after.finished - before.finished).toBe(3 + 1 + 1 + 2); // one engine request per input

    const usage = await charged(4, answered);
    expect(usage).toEqual({
      requests: 4,
      prompt: after.prompt - before.prompt,
      completion: 0,
      partial: 0,
      // The engine counted every token: nothing is an estimate.
      estimatedRequests: 0,
      estimatedTokens: 0,
    });
  });

  it("answers bad requests with OpenAI-shaped 400s, from the edge and from the engine", async () => {
    const engineBefore = await engineCounters(sim);
    const ledgerBefore = await keyUsage(edge, key.id);
    // The edge's own validation.
    const missing = await client.embeddings.create({ model: "embedder" } as never).catch((e) => e);
    // Passes the edge (any dimensions ≥ 1), refused by the engine: more than it has.
    const tooWide = await client.embeddings
      .create({ model: "embedder", input: "x", dimensions: DIM + 1, encoding_format: "float" })
      .catch((e) => e);
    for (const [err, param] of [
      [missing, "input"],
      [tooWide, "dimensions"],
    ] as const) {
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect(err.status).toBe(400);
      expect(err.type).toBe("invalid_request_error");
      expect(err.param).toBe(param);
      expect(Object.keys(err.error).sort()).toEqual(["code", "message", "param", "type"]);
      expect(err.error).toMatchObject({ message: expect.any(String), type: "invalid_request_error", param });
      expect(err.code === null || typeof err.code === "string").toBe(true);
    }
    expect(tooWide.message).toMatch(/at most 384/);

    // Nothing was prefilled for them, and nothing is charged for them but (at
    // most) a request: a good request after them is charged in order.
    const good = await client.embeddings.create({ model: "embedder", input: "after the errors" });
    const engineAfter = await engineCounters(sim);
    expect(engineAfter.prompt - engineBefore.prompt).toBe(good.usage.prompt_tokens);
    const usage = await charged(ledgerBefore.requests + 1, ledgerBefore.prompt + good.usage.prompt_tokens);
    expect(usage.prompt).toBe(ledgerBefore.prompt + good.usage.prompt_tokens);
    expect(usage.completion).toBe(ledgerBefore.completion);
  });
});
