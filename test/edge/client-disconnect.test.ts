import { connect } from "node:net";
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
  streamThenHangUp,
  type TestKey,
} from "./helpers.ts";

/**
 * Clients that hang up, as the edge in workerd sees them: mid-stream, and
 * after their 200 but before the first token, while the engine is still in
 * prefill. Each
 * request's lease goes back to the pool and each is charged once (a cut
 * stream more than nothing). The edge runs on Miniflare's direct socket:
 * under `wrangler dev` its local proxy now and then does not pass a hang-up
 * on, and the stream is charged as complete.
 *
 * Known gap: workerd's "Uncaught Error: Network connection lost" after a
 * mid-stream hang-up (edge/proxy/attempt.ts, relay). Under `wrangler dev`
 * this test's hang-ups still log it with relay's reader.cancel() in place;
 * on the direct socket it was not logged with or without it, so the log
 * check below guards against a regression there but does not hold that fix.
 */
const MID_STREAM = 16;
const BEFORE_FIRST_TOKEN = 6;

describe("clients that hang up", () => {
  let edge: FastEdge;
  let key: TestKey;

  beforeAll(async () => {
    const [e, slow, mute] = await Promise.all([
      startEdgeMiniflare(),
      // About 3 ms a token: a 400-token answer is still streaming when the client leaves.
      startSim("slow", ["--sim-speed", "2"]),
      // A prefill of 200 ms a prompt token: the first token comes seconds after admission.
      startSim("mute", ["--sim-prefill-us-per-token", "200000"]),
    ]);
    edge = e;
    await setEndpoints(edge, [
      { id: "slow-1", url: slow.url, models: ["slow"] },
      { id: "mute-1", url: mute.url, models: ["mute"] },
    ]);
    key = await createKey(edge);
  }, 90_000);

  afterAll(stopStarted);

  const headers = () => ({ authorization: `Bearer ${key.secret}` });

  async function pool(model: string) {
    const { pools } = await edge.sync.getPoolStatus({ model });
    return pools[0]!;
  }

  /** Requests the pool has routed so far, every tier counted. */
  function routed(p: { routes: Record<string, bigint> }): bigint {
    return Object.values(p.routes).reduce((a, b) => a + b, 0n);
  }

  /**
   * Sends a streamed request on a socket of its own and destroys it once `leave()` says so and
   * what came back so far satisfies `seen`.
   */
  async function hangUpWhen(
    body: unknown,
    leave: () => Promise<boolean>,
    seen: (sofar: string) => boolean = () => true,
  ): Promise<string> {
    const u = new URL(edge.url);
    const payload = Buffer.from(JSON.stringify(body));
    const head = [
      "POST /v1/chat/completions HTTP/1.1",
      `host: ${u.host}`,
      "content-type: application/json",
      `content-length: ${payload.length}`,
      ...Object.entries(headers()).map(([k, v]) => `${k}: ${v}`),
    ].join("\r\n");
    const sock = connect(Number(u.port), u.hostname);
    let got = "";
    sock.on("data", (d: Buffer) => {
      got += d.toString("utf8");
    });
    sock.on("error", () => {});
    sock.write(Buffer.concat([Buffer.from(`${head}\r\n\r\n`), payload]));
    try {
      await waitUntil("the moment to leave", async () => seen(got) && (await leave()), 20_000, 20);
    } finally {
      sock.destroy();
    }
    return got;
  }

  it("a client gone mid-stream or before the first token: leases released, every request charged, no uncaught error", async () => {
    const before = await keyUsage(edge, key.id);
    for (let i = 0; i < MID_STREAM; i++) {
      const r = await streamThenHangUp(
        edge.url,
        "/v1/chat/completions",
        headers(),
        chatBody("slow", {
          max_tokens: 400,
          stream: true,
          messages: [{ role: "user", content: `story ${i}` }],
        }),
        3,
      );
      expect(r.head).toMatch(/^HTTP\/1\.1 200/);
      expect(r.events).toBeGreaterThanOrEqual(3);
    }
    for (let i = 0; i < BEFORE_FIRST_TOKEN; i++) {
      // Leaves once the pool has routed this request to the engine and its 200 has come (the
      // stream is committed at the engine's headers), long before its first token. The
      // routing count, not the lease count, says it is this request: the previous one's lease
      // may still be held. The leases checked below are released only if the edge saw the
      // hang-up: the first token is most of a minute away.
      const routedBefore = routed(await pool("mute"));
      const got = await hangUpWhen(
        chatBody("mute", {
          stream: true,
          // Unique from the first block: a prompt the engine has cached would answer before the client leaves.
          messages: [{ role: "user", content: `${i} ${"lorem ipsum ".repeat(100)}` }],
        }),
        async () => routed(await pool("mute")) > routedBefore,
        (sofar) => sofar.includes("\r\n\r\n"),
      );
      expect(got).toMatch(/^HTTP\/1\.1 200/);
      expect(got).not.toContain("data:");
    }
    const total = MID_STREAM + BEFORE_FIRST_TOKEN;
    const usage = await waitUntil(
      "every request charged",
      async () => {
        const u = await keyUsage(edge, key.id);
        return u.requests - before.requests === total ? u : undefined;
      },
      30_000,
    );
    // Each stream cut after its first tokens is charged them and its prompt.
    expect(usage.partial - before.partial).toBeGreaterThanOrEqual(MID_STREAM);
    expect(usage.completion - before.completion).toBeGreaterThanOrEqual(MID_STREAM);
    for (const model of ["slow", "mute"]) {
      await waitUntil(
        `${model}'s leases released`,
        async () => {
          const p = await pool(model);
          return p.leases === 0 && p.endpoints.every((e) => e.inflight === 0);
        },
        20_000,
      );
    }
    // The hang-ups were the clients', not the engines': no breaker opened.
    expect((await pool("slow")).endpoints[0]!.breaker).toBe("closed");
    expect(edge.logged.filter((l) => /Uncaught|Network connection lost/.test(l))).toEqual([]);
  }, 120_000);
});
