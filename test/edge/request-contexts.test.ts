import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  chatBody,
  createKey,
  type FastEdge,
  keyUsage,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
  stopStarted,
} from "./helpers.ts";

/**
 * On Workers a promise belongs to the request that made it. A request that
 * waits only on another request's promise is cancelled as hung, and what
 * it would have done next is lost; workerd says so with a warning naming a
 * "different request context". Requests share work in two places: their
 * charges go to the key's ledger in batches (edge/keys/charge-batcher.ts), and
 * their admits, polls and releases ride in each other's calls to the pool
 * (edge/routing/pool-channel.ts). Both under load, with admits queueing at
 * the pool, in workerd on Miniflare's direct socket.
 */
const REQUESTS = 400;
const CONCURRENCY = 32;

describe("requests that share work", () => {
  let edge: FastEdge;

  beforeAll(async () => {
    edge = await startEdgeMiniflare();
    // Two small engines: most of the 32 concurrent requests queue at the pool.
    const sims = await Promise.all(
      [0, 1].map(() => startSim("ctx", ["--max-num-seqs", "4", "--sim-speed", "20"])),
    );
    await setEndpoints(
      edge,
      sims.map((s, i) => ({ id: `ctx-${i}`, url: s.url, models: ["ctx"], capacity: { maxNumSeqs: 4 } })),
    );
  }, 90_000);

  afterAll(stopStarted);

  it("are each charged, and none is cancelled for waiting on another's promise", async () => {
    // Without limits a key's charges gather for a second; with them, 10 ms.
    const keys = [await createKey(edge), await createKey(edge, { rpm: 1_000_000 })];
    let next = 0;
    const statuses: number[] = [];
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        for (let i = next++; i < REQUESTS; i = next++) {
          const key = keys[i % keys.length]!;
          const r = await fetch(`${edge.url}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${key.secret}`, "content-type": "application/json" },
            body: JSON.stringify(
              chatBody("ctx", { max_tokens: 4, messages: [{ role: "user", content: `hi ${i}` }] }),
            ),
          });
          await r.arrayBuffer();
          statuses.push(r.status);
        }
      }),
    );
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    for (const key of keys) {
      await waitUntil(
        `${key.id} charged for each of its requests`,
        async () => (await keyUsage(edge, key.id)).requests === REQUESTS / keys.length,
        20_000,
      );
    }
    expect(edge.logged.filter((l) => /different request context/.test(l))).toEqual([]);
  });
});
