import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  chatBody,
  createKey,
  type Edge,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * What a key opens at the edge stays what it says (docs/security.md): a
 * key limited to a model is not served by that model's fallback unless it
 * may use the fallback too.
 */
describe("a key's models and the fallbacks", () => {
  let edge: Edge;
  let sim: Sim;
  let alphaOnly: TestKey;
  let alphaAndBeta: TestKey;
  let byAlias: TestKey;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([startEdge({}, "edge-key-doors"), startSim("beta")]);
    await edge.sync.putCatalog({
      models: [
        { name: "alpha", aliases: [], fallbacks: ["beta"], routing: "chat" },
        { name: "beta", aliases: ["beta-latest"], fallbacks: [], routing: "chat" },
      ],
    });
    // alpha has no endpoint: every request for it goes on to its fallback.
    await setEndpoints(edge, [{ id: "beta-1", url: sim.url, models: ["beta"] }]);
    [alphaOnly, alphaAndBeta, byAlias] = await Promise.all([
      createKey(edge, { models: ["alpha"] }),
      createKey(edge, { models: ["alpha", "beta"] }),
      createKey(edge, { models: ["alpha", "beta-latest"] }),
    ]);
  }, 120_000);

  afterAll(stopStarted);

  const ask = (key: TestKey) =>
    fetch(`${edge.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key.secret}`, "content-type": "application/json" },
      body: JSON.stringify(chatBody("alpha")),
    });

  it("skips a fallback the key may not use", async () => {
    const r = await ask(alphaOnly);
    const body = (await r.json()) as { error?: { type: string }; model?: string };
    expect(r.status, JSON.stringify(body)).toBeGreaterThanOrEqual(500);
    expect(body.model).toBeUndefined();
    expect(body.error).toBeDefined();
  });

  it("uses a fallback the key may use, by name or by alias", async () => {
    for (const key of [alphaAndBeta, byAlias]) {
      const r = await ask(key);
      const body = (await r.json()) as { model?: string };
      expect(r.status, JSON.stringify(body)).toBe(200);
      expect(body.model).toBe("beta");
    }
  });
});
