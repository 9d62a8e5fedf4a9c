import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../../common/processes.ts";
import { readTrace } from "../../sim-engine/request-trace.ts";
import { clientFor, createKey, setEndpoints, startEdgeMiniflare, startSim, stopStarted } from "./helpers.ts";

/**
 * The edge in workerd (as `npm start` runs it) keeps its connections to an
 * engine alive: requests one after another come on one connection, as the
 * engine's trace numbers them (--sim-trace). An answer left half-read, such
 * as a stream whose `[DONE]` came and whose body's end was never read,
 * cannot go back to the runtime's pool, and every request then pays a TCP
 * handshake and the engine's accept before its first token. Per kind of
 * answer: streamed with and without usage asked for, not streamed, and a
 * stream from a server that sends no `[DONE]` (--sim-quirks no-done).
 */
const ROUNDS = 6;

describe("edge keeps its connections to engines alive", () => {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-engine-connections-"));
  let client: OpenAI;

  beforeAll(async () => {
    const [edge, vllm, noDone] = await Promise.all([
      startEdgeMiniflare(),
      // Real time: every token a write of its own, the end of the body one more.
      startSim("conn", ["--sim-speed", "1", "--sim-trace", join(dir, "conn.jsonl")]),
      startSim("conn-no-done", [
        "--sim-speed",
        "1",
        "--sim-quirks",
        "no-done",
        "--sim-trace",
        join(dir, "conn-no-done.jsonl"),
      ]),
    ]);
    await setEndpoints(edge, [
      { id: "conn", url: vllm.url, models: ["conn"] },
      { id: "conn-no-done", url: noDone.url, models: ["conn-no-done"] },
    ]);
    client = clientFor(edge, (await createKey(edge)).secret);
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  /** Sends ROUNDS requests one after another; the engine's connection for each. */
  async function connectionsOf(model: string, tag: string, send: (user: string) => Promise<void>) {
    const users = Array.from({ length: ROUNDS }, (_, i) => `${tag}-${i}`);
    for (const user of users) await send(user);
    const trace = await waitUntil(`the engine's trace of every ${tag} request`, () => {
      const t = readTrace(join(dir, `${model}.jsonl`));
      return users.every((u) => t.has(u)) && t;
    });
    return users.map((u) => trace.get(u)!.connection);
  }

  const stream = (model: string, usage: boolean) => async (user: string) => {
    const s = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 4,
      stream: true,
      ...(usage ? { stream_options: { include_usage: true } } : {}),
      user,
    });
    for await (const _ of s) {
      // Read to the end, as a client does.
    }
  };

  it.each([
    ["streamed", "conn", stream("conn", false)],
    ["streamed with usage", "conn", stream("conn", true)],
    [
      "not streamed",
      "conn",
      async (user: string) => {
        await client.chat.completions.create({
          model: "conn",
          messages: [{ role: "user", content: "Hello" }],
          max_tokens: 4,
          user,
        });
      },
    ],
    ["streamed, no [DONE]", "conn-no-done", stream("conn-no-done", false)],
  ] as const)("%s: one request after another on one connection", async (kind, model, send) => {
    const connections = await connectionsOf(model, kind.replace(/\W+/g, "-"), send);
    // The first may open a connection of its own; from then on, one.
    expect(new Set(connections.slice(1)).size, `connections: ${connections.join(", ")}`).toBe(1);
  });
});
