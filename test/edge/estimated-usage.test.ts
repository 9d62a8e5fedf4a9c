import type OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runLlmgw, waitUntil } from "../harness/process.ts";
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
 * Usage the edge had to estimate is marked as an estimate wherever usage
 * goes (docs/engines.md, "How usage is counted"): the key's totals count
 * the requests and tokens that were estimates, and the model's pool counts
 * them for `llmgw_edge_estimated_*`. The edge in workerd, an engine with
 * `--sim-quirks no-usage` (it never reports usage) and one that does, both
 * driven by the openai client.
 */
describe("estimated usage, marked", () => {
  let edge: Edge;

  beforeAll(async () => {
    const [e, none, exact] = await Promise.all([
      startEdge(),
      startSim("est", ["--sim-quirks", "no-usage", "--sim-speed", "50"]),
      startSim("exact", ["--sim-speed", "50"]),
    ]);
    edge = e;
    await setEndpoints(edge, [
      { id: "est-1", url: none.url, models: ["est"] },
      { id: "exact-1", url: exact.url, models: ["exact"] },
    ]);
  }, 90_000);

  afterAll(stopStarted);

  async function ask(client: OpenAI, model: string, stream: boolean, includeUsage = false) {
    const messages = [{ role: "user" as const, content: "Tell me about the sea, briefly." }];
    if (!stream) {
      const r = await client.chat.completions.create({ model, messages, max_tokens: 10 });
      return r.choices[0]!.message.content ?? "";
    }
    const s = await client.chat.completions.create({
      model,
      messages,
      max_tokens: 10,
      stream: true,
      ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
    });
    let text = "";
    for await (const c of s) text += c.choices[0]?.delta.content ?? "";
    return text;
  }

  async function charged(keyId: string, requests: number) {
    return waitUntil(
      `${requests} charges`,
      async () => {
        const u = await keyUsage(edge, keyId);
        return u.requests === requests ? u : undefined;
      },
      20_000,
    );
  }

  it("counts an engine's missing usage as estimated in the key's totals, and exact usage as not", async () => {
    const est = await createKey(edge);
    const estClient = clientFor(edge, est.secret);
    for (const [stream, includeUsage] of [
      [true, false],
      [true, true],
      [false, false],
    ] as const) {
      expect((await ask(estClient, "est", stream, includeUsage)).length).toBeGreaterThan(0);
    }
    const u = await charged(est.id, 3);
    expect(u.prompt).toBeGreaterThan(0);
    expect(u.completion).toBeGreaterThan(0);
    expect(u.estimatedRequests).toBe(3);
    expect(u.estimatedTokens).toBe(u.prompt + u.completion);
    // As the operator reads it.
    const env = { LLMGW_EDGE_TOKEN: edge.token };
    const json = await runLlmgw(["keys", "usage", est.id, "--json", "--edge", edge.url], env);
    expect(JSON.parse(json.stdout)).toMatchObject([
      { id: est.id, requests: 3, estimated_requests: 3, estimated_tokens: u.prompt + u.completion },
    ]);
    const table = await runLlmgw(["keys", "usage", est.id, "--edge", edge.url], env);
    expect(table.stdout).toMatch(/\bESTIMATED\b/);
    expect(table.stdout).toContain(`3 req, ${u.prompt + u.completion} tok`);

    const exact = await createKey(edge);
    const exactClient = clientFor(edge, exact.secret);
    await ask(exactClient, "exact", true);
    await ask(exactClient, "exact", false);
    const x = await charged(exact.id, 2);
    expect(x.completion).toBe(20);
    expect(x.estimatedRequests).toBe(0);
    expect(x.estimatedTokens).toBe(0);
  });

  it("counts estimates per model in the model's pool, none for a model whose engine reports usage", async () => {
    const client = clientFor(edge, (await createKey(edge)).secret);
    // An isolate tells the pool its estimates with the model's next admission,
    // so each round asks once more: the rounds before it are what the pool shows.
    const status = await waitUntil(
      "the pool's count of estimated requests",
      async () => {
        await ask(client, "est", true);
        await ask(client, "exact", true);
        const { pools } = await edge.sync.getPoolStatus({});
        const of = (m: string) => pools.find((p) => p.model === m)!;
        return of("est").estimatedRequests >= 3n ? { est: of("est"), exact: of("exact") } : undefined;
      },
      30_000,
    );
    expect(status.est.estimatedTokens).toBeGreaterThan(status.est.estimatedRequests);
    expect(status.exact.estimatedRequests).toBe(0n);
    expect(status.exact.estimatedTokens).toBe(0n);
  });
});
