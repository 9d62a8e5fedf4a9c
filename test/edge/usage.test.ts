import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  createKey,
  type Edge,
  engineCounters,
  keyUsage,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  streamThenHangUp,
  type TestKey,
} from "./helpers.ts";

/**
 * Usage accounting end to end: the KeyLedger's totals against the sim
 * engines' own counters (vllm:prompt_tokens_total,
 * vllm:generation_tokens_total), for 100 mixed requests of which 20 are cut
 * off by the client mid-stream.
 */
const COMPLETED = 80;
const DISCONNECTED = 20;

interface Counters {
  prompt: number;
  generation: number;
}

describe("usage accounting", () => {
  let edge: Edge;
  let sims: Sim[];
  let key: TestKey;

  beforeAll(async () => {
    const flags = ["--sim-speed", "10", "--sim-output-len", "2000"];
    let a: Sim;
    let b: Sim;
    let slow: Sim;
    // The disconnecting clients use a slower engine so that the hang-up
    // reliably lands mid-answer (through wrangler dev's local proxy, a
    // client's disconnect takes tens of milliseconds to reach the Worker).
    [edge, a, b, slow] = await Promise.all([
      startEdge(),
      startSim("u", flags),
      startSim("u", flags),
      startSim("slow", ["--sim-speed", "2", "--sim-output-len", "2000"]),
    ]);
    sims = [a, b, slow];
    await setEndpoints(edge, [
      { id: "u-a", url: a.url, models: ["u"] },
      { id: "u-b", url: b.url, models: ["u"] },
      { id: "slow", url: slow.url, models: ["slow"] },
    ]);
    key = await createKey(edge);
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  function summed(all: readonly Counters[]): Counters {
    return {
      prompt: all.reduce((s, c) => s + c.prompt, 0),
      generation: all.reduce((s, c) => s + c.generation, 0),
    };
  }

  async function engines(): Promise<Counters> {
    return summed(await Promise.all(sims.map(engineCounters)));
  }

  /** Engine counters once no engine runs or holds a request (a cancelled one is reaped within a step). */
  async function settledEngines(): Promise<Counters> {
    const idle = await waitUntil(
      "every engine idle",
      async () => {
        const all = await Promise.all(sims.map(engineCounters));
        return all.every((c) => c.busy === 0) ? all : undefined;
      },
      20_000,
      25,
    );
    return summed(idle);
  }

  const headers = () => ({ authorization: `Bearer ${key.secret}`, "content-type": "application/json" });

  function request(i: number): Promise<void> {
    const kind = i % 5;
    const max = 4 + ((i * 7) % 40);
    const content = `Request ${i}: ${"lorem ipsum ".repeat(1 + (i % 9))}`;
    const path = kind === 4 ? "/v1/completions" : "/v1/chat/completions";
    const body =
      kind === 4
        ? { model: "u", prompt: content, max_tokens: max, stream: i % 2 === 0 }
        : {
            model: "u",
            messages: [{ role: "user", content }],
            max_tokens: max,
            stream: kind !== 0,
            ...(kind === 2 ? { stream_options: { include_usage: true } } : {}),
            ...(kind === 3 ? { stream_options: { include_usage: true, continuous_usage_stats: true } } : {}),
          };
    return fetch(`${edge.url}${path}`, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
    }).then(async (r) => {
      expect(r.status).toBe(200);
      await r.text();
    });
  }

  it("charges completed requests exactly what the engines counted, and cut-off ones within the in-flight bound", async () => {
    const before = await engines();
    // 80 completed requests, 8 at a time, streamed and not, chat and completions.
    let next = 0;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (next < COMPLETED) await request(next++);
      }),
    );
    await waitUntil(
      "80 charges",
      async () => (await keyUsage(edge, key.id)).requests === COMPLETED,
      20_000,
      50,
    );
    const mid = await settledEngines();
    const ledgerMid = await keyUsage(edge, key.id);
    expect(ledgerMid.prompt).toBe(mid.prompt - before.prompt);
    expect(ledgerMid.completion).toBe(mid.generation - before.generation);
    expect(ledgerMid.partial).toBe(0);

    // 20 clients that read a few chunks and hang up, one at a time so each
    // one's engine delta can be compared with its own charge.
    const gaps: number[] = [];
    let observed = 0;
    for (let i = 0; i < DISCONNECTED; i++) {
      const e0 = await settledEngines();
      const l0 = await keyUsage(edge, key.id);
      const wanted = 2 + ((i * 5) % 25);
      const got = await streamThenHangUp(
        edge.url,
        "/v1/chat/completions",
        { authorization: `Bearer ${key.secret}` },
        {
          model: "slow",
          messages: [{ role: "user", content: `disconnect ${i}` }],
          max_tokens: 1500,
          stream: true,
        },
        wanted,
      );
      expect(got.head).toMatch(/^HTTP\/1.1 200/);
      await waitUntil(
        `charge ${i}`,
        async () => (await keyUsage(edge, key.id)).requests === l0.requests + 1,
        20_000,
        25,
      );
      const e1 = await settledEngines();
      const l1 = await keyUsage(edge, key.id);
      const generated = e1.generation - e0.generation;
      const charged = l1.completion - l0.completion;
      // Exact for the prompt, whatever happened to the answer.
      expect(l1.prompt - l0.prompt).toBe(e1.prompt - e0.prompt);
      expect(charged).toBeGreaterThanOrEqual(wanted - 1);
      expect(charged).toBeLessThanOrEqual(generated);
      if (l1.partial - l0.partial === 1) observed++;
      else expect(charged).toBe(generated); // streamed to the end: exact
      gaps.push(generated - charged);
    }
    const final = await keyUsage(edge, key.id);
    expect(final.requests).toBe(COMPLETED + DISCONNECTED);
    // wrangler dev puts its ProxyWorker (another workerd, over HTTP) in
    // front of the Worker, and it sometimes fails to pass a client's
    // hang-up on, so the Worker streams that answer to its end (and charges
    // it exactly). Most hang-ups do arrive; those are the partial requests.
    expect(final.partial).toBe(observed);
    expect(observed).toBeGreaterThanOrEqual(DISCONNECTED / 2);
    // Charging is idempotent by request id and happens once per request:
    // the count above is exact, and nothing arrives later. One more request,
    // charged after all of them, is the barrier: the ledger then holds
    // exactly one more.
    await request(COMPLETED + DISCONNECTED);
    await waitUntil(
      "the barrier request's charge",
      async () => (await keyUsage(edge, key.id)).requests > COMPLETED + DISCONNECTED,
      20_000,
      25,
    );
    expect((await keyUsage(edge, key.id)).requests).toBe(COMPLETED + DISCONNECTED + 1);
    console.log(
      `hang-ups seen by the Worker: ${observed}/${DISCONNECTED}; tokens generated but not charged: ${gaps.join(",")} (max ${Math.max(...gaps)})`,
    );
    // Tokens the engine produced after the last chunk the edge read before
    // it aborted the upstream request (docs/edge.md, "The disconnect
    // bound"): how many is time over the engine's token time, typically 0-4
    // here but 28 once under a full test run's load, so it is logged, not
    // held to. What is held: every hang-up stopped its engine, within a
    // second of its time (200 tokens), far short of the 1,500 asked for.
    expect(Math.max(...gaps)).toBeLessThanOrEqual(200);
  }, 120_000);
});
