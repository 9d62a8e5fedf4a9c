import { connect as tcpConnect } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  chatBody,
  createKey,
  type Edge,
  type FastEdge,
  type Sim,
  setEndpoints,
  startEdge,
  startEdgeMiniflare,
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

/**
 * `max_concurrent` on a key, counted by its KeyLedger: requests beyond it
 * are refused at once with 429 concurrency_limit, and a request's place is
 * given back when it ends, a client hanging up mid-stream included.
 */
describe("a key's requests in flight", () => {
  // The Worker in workerd with nothing in front: wrangler dev's proxy now
  // and then does not pass a client's hang-up on (test/edge/usage.test.ts).
  let fast: FastEdge;
  let sim: Sim;
  const MODEL = "gamma";
  // Every request goes at once: the pool's queues are not what is tested.
  const router = { admission: { enabled: false } };

  beforeAll(async () => {
    // Real time (--sim-speed 1): a stream of 2,000 tokens outlasts the test.
    [fast, sim] = await Promise.all([startEdgeMiniflare(router), startSim(MODEL, ["--sim-speed", "1"])]);
    await setEndpoints(fast, [{ id: "gamma-1", url: sim.url, models: [MODEL] }]);
  }, 120_000);

  afterAll(stopStarted);

  /**
   * A stream held open after its first event, on a connection of its own;
   * `hangUp` destroys the socket mid-stream (as a client that dies does:
   * fetch's abort may leave wrangler dev's proxy holding the request).
   */
  function open(on: { url: string }, key: TestKey) {
    const u = new URL(on.url);
    const payload = JSON.stringify(chatBody(MODEL, { stream: true, max_tokens: 2_000, ignore_eos: true }));
    const head = [
      "POST /v1/chat/completions HTTP/1.1",
      `host: ${u.host}`,
      `authorization: Bearer ${key.secret}`,
      "content-type: application/json",
      `content-length: ${Buffer.byteLength(payload)}`,
      "connection: close",
    ].join("\r\n");
    return new Promise<{ status: number; retryAfter?: string; code?: string; hangUp: () => void }>(
      (resolve, reject) => {
        const sock = tcpConnect(Number(u.port), u.hostname, () => sock.write(`${head}\r\n\r\n${payload}`));
        const hangUp = () => sock.destroy();
        let text = "";
        const parsed = () => {
          const end = text.indexOf("\r\n\r\n");
          const lines = text.slice(0, end).split("\r\n");
          const header = (name: string) =>
            lines
              .find((l) => l.toLowerCase().startsWith(`${name}:`))
              ?.slice(name.length + 1)
              .trim();
          return { status: Number(lines[0]!.split(" ")[1]), body: text.slice(end + 4), header };
        };
        sock.on("data", (d: Buffer) => {
          text += d.toString("utf8");
          if (!text.includes("\r\n\r\n")) return;
          const r = parsed();
          if (r.status === 200 && r.body.includes("\n\n")) resolve({ status: 200, hangUp });
        });
        sock.on("error", reject);
        sock.on("close", () => {
          const r = parsed();
          const code = /"code":"([^"]+)"/.exec(r.body)?.[1];
          resolve({
            status: r.status,
            ...(code ? { code } : {}),
            ...(r.header("retry-after") ? { retryAfter: r.header("retry-after") } : {}),
            hangUp,
          });
        });
      },
    );
  }

  it("refuses the request beyond max_concurrent with 429 concurrency_limit, and frees a place when a client hangs up", async () => {
    const key = await createKey(fast, { maxConcurrent: 3 });
    const held = [await open(fast, key), await open(fast, key), await open(fast, key)];
    expect(held.map((h) => h.status)).toEqual([200, 200, 200]);
    const over = await open(fast, key);
    expect(over).toMatchObject({ status: 429, code: "concurrency_limit", retryAfter: "1" });

    held[0]!.hangUp();
    const next = await waitUntil("a place freed by the hang-up", async () => {
      const o = await open(fast, key);
      return o.status === 200 ? o : undefined;
    });
    expect((await open(fast, key)).status).toBe(429);
    for (const h of [...held, next]) h.hangUp();
  });
});
