import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type Edge,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * The burst that once inverted the bands, on real processes: four sim
 * engines of 4 slots each at a quarter of real time behind the edge in
 * workerd, their capacity stated in the endpoint set and no
 * `target_inflight` override. 120 bronze streams arrive at once, then
 * platinum. Without a load feed the pool has only its own charges to go
 * by, which is the point: they must hold from the first request. A batch
 * of 4 is under `seq_floor` (16), so every slot counts: the fleet
 * saturates at 16 in flight, and bronze's ceiling (0.30) is 4.8 of them: 5
 * dispatched, the rest queued or refused. Platinum (ceiling 1.00) has the
 * other 11 slots, enough for all 10 of its streams at once.
 */
afterAll(stopStarted);

const BRONZE = 120;
// Small enough to fill before queue_ttl even when a loaded machine sends
// the 120 at a few a second: queued requests expire after 10 s, so a
// queue that takes longer than that to fill never refuses.
const QUEUE = 20;
const HANG_MS = 60_000;

interface Result {
  band: string;
  status: number;
  code: string | null;
  retryAfter: string | null;
}

describe("a burst at the edge", () => {
  let edge: Edge;
  let key: TestKey;

  beforeAll(async () => {
    const started = await Promise.all([
      startEdge({ admission: { queue_ttl: "10s", queue_capacity_per_band: QUEUE } }),
      ...Array.from({ length: 4 }, () => startSim("burst", ["--sim-speed", "0.25", "--max-num-seqs", "4"])),
    ]);
    edge = started[0] as Edge;
    await setEndpoints(
      edge,
      started.slice(1).map((s, i) => ({
        id: `burst-${i}`,
        url: (s as { url: string }).url,
        models: ["burst"],
        capacity: { maxNumSeqs: 4 },
      })),
    );
    key = await createKey(edge, { band: "platinum" });
  }, 120_000);

  async function ask(band: string, n: number): Promise<Result> {
    try {
      const stream = await clientFor(edge, key.secret).chat.completions.create(
        {
          model: "burst",
          messages: [{ role: "user", content: `${band} ${n}` }],
          // About 5 s an answer at this speed: bronze's 5 slots serve one a
          // second, slower than even a loaded machine sends the 120, so
          // the queue fills and refuses.
          max_tokens: 160,
          stream: true,
        },
        { headers: { "x-llmgw-band": band }, signal: AbortSignal.timeout(HANG_MS) },
      );
      for await (const _ of stream) {
        // Read to the end: a stream cut short would throw here.
      }
      return { band, status: 200, code: null, retryAfter: null };
    } catch (err) {
      const e = err as { status?: number; code?: string | null; headers?: Headers };
      if (e.status === undefined) return { band, status: 0, code: "hang or broken", retryAfter: null };
      return {
        band,
        status: e.status,
        code: e.code ?? null,
        retryAfter: e.headers?.get("retry-after") ?? null,
      };
    }
  }

  // Through wrangler dev's local proxy, a call may be turned away while 120
  // streams hold it: asked again until it answers.
  const pool = () =>
    waitUntil("the pool's status", async () => (await edge.sync.getPoolStatus({ model: "burst" })).pools[0]);
  const band = (p: Awaited<ReturnType<typeof pool>>, name: string) => p.bands.find((b) => b.name === name)!;
  const inFlight = (p: Awaited<ReturnType<typeof pool>>) => p.endpoints.reduce((n, e) => n + e.inflight, 0);

  it("holds bronze at its ceiling from the first request, serves platinum through it, and answers every request", async () => {
    const bronze = Array.from({ length: BRONZE }, (_, i) => ask("bronze", i));
    // Every bronze request has been admitted, queued or refused.
    let most = 0;
    // Every request the pool has seen is admitted, refused, or waiting or
    // was, whether it waited first or not: on a loaded machine the 120 may
    // arrive slower than bronze's first answers finish, and later ones are
    // then admitted without queueing.
    const arrived = (b: ReturnType<typeof band>) =>
      Number(b.admitted) + Number(b.full) + Number(b.expired) + Number(b.abandoned) + b.depth;
    await waitUntil(
      "the bronze burst has arrived",
      async () => {
        const p = await pool();
        most = Math.max(most, inFlight(p));
        const b = band(p, "bronze");
        return arrived(b) >= BRONZE;
      },
      90_000,
    );
    const held = await pool();
    // Counted, not seen: on a loaded machine the pool's status may not
    // answer a poll while the queue holds requests.
    expect(Number(band(held, "bronze").queued), "bronze requests that waited in the queue").toBeGreaterThan(
      0,
    );
    expect(inFlight(held)).toBeLessThanOrEqual(5);
    expect(most, "bronze in flight at any poll").toBeLessThanOrEqual(5);

    // Platinum, while bronze still waits in its queue: dispatched at once.
    const platinum = await Promise.all(Array.from({ length: 10 }, (_, i) => ask("platinum", i)));
    expect(platinum.map((r) => `${r.status} ${r.code}`)).toEqual(Array(10).fill("200 null"));
    const after = await pool();
    expect(band(after, "platinum")).toMatchObject({ admitted: 10n, queued: 0n });

    const results = await Promise.all(bronze);
    const outcomes = new Set(results.map((r) => `${r.status} ${r.code}`));
    for (const o of outcomes) expect(["200 null", "429 queue_full", "503 queue_timeout"]).toContain(o);
    const refused = results.filter((r) => r.status === 429);
    expect(refused.length).toBeGreaterThan(0);
    for (const r of refused) expect(Number(r.retryAfter)).toBeGreaterThan(0);

    // The pool counted what the clients saw, and nothing is left held.
    await waitUntil("every lease released", async () => (await pool()).leases === 0);
    const end = band(await pool(), "bronze");
    expect([Number(end.full), Number(end.expired), Number(end.admitted)]).toEqual([
      refused.length,
      results.filter((r) => r.code === "queue_timeout").length,
      results.filter((r) => r.status === 200).length,
    ]);
  }, 180_000);
});

/**
 * The same burst on engines with vLLM's default batch (256): by sequences
 * bronze is nowhere near its ceiling, but each engine prefills oldest
 * first, so every long prompt admitted ahead is time a platinum prompt
 * waits. The pool counts streams admitted and not yet at their first token
 * (the Worker reports it) against `target_prefilling` (2): with two
 * engines, bronze's 0.30 lets 2 prefill at once, and platinum's 1.00 has
 * room for 2 more. The old design admitted all 40 at once.
 */
describe("a burst of long prompts on large batches", () => {
  let edge: Edge;
  let key: TestKey;
  const LONG = 40;
  const prompt = (n: number) => `${n} ${"lorem ipsum dolor sit amet ".repeat(160)}`;

  beforeAll(async () => {
    const started = await Promise.all([
      startEdge({ admission: { queue_ttl: "60s", queue_capacity_per_band: LONG } }),
      // About 0.5 s of prefill for each prompt, decode at full speed.
      ...Array.from({ length: 2 }, () =>
        startSim("long", ["--sim-speed", "1", "--sim-prefill-us-per-token", "500"]),
      ),
    ]);
    edge = started[0] as Edge;
    await setEndpoints(
      edge,
      started.slice(1).map((s, i) => ({
        id: `long-${i}`,
        url: (s as { url: string }).url,
        models: ["long"],
        capacity: { maxNumSeqs: 256 },
      })),
    );
    key = await createKey(edge, { band: "platinum" });
  }, 120_000);

  const ask = async (band: string, n: number): Promise<void> => {
    const stream = await clientFor(edge, key.secret).chat.completions.create(
      { model: "long", messages: [{ role: "user", content: prompt(n) }], max_tokens: 48, stream: true },
      { headers: { "x-llmgw-band": band }, signal: AbortSignal.timeout(HANG_MS) },
    );
    for await (const _ of stream) {
      // Read to the end: a stream cut short would throw here.
    }
  };
  const pool = () =>
    waitUntil("the pool's status", async () => (await edge.sync.getPoolStatus({ model: "long" })).pools[0]);
  const bronzeBand = async () => (await pool()).bands.find((b) => b.name === "bronze")!;

  it("lets bronze prefill two at a time, serves platinum through it, and serves every bronze stream", async () => {
    const bronze = Array.from({ length: LONG }, (_, i) => ask("bronze", i));
    let most = 0;
    let decoding = false;
    const look = async () => {
      const p = await pool();
      const prefilling = p.endpoints.reduce((n, e) => n + e.prefilling, 0);
      most = Math.max(most, prefilling);
      decoding ||= p.endpoints.reduce((n, e) => n + e.inflight, 0) > prefilling;
      return p;
    };
    await waitUntil("bronze queued behind the prompts prefilling", async () => {
      await look();
      return (await bronzeBand()).depth > 0;
    });
    expect(most, "bronze streams prefilling at any poll").toBeLessThanOrEqual(2);
    // Platinum's ceiling (1.00) is 4 prefilling: with bronze's 2, two more go at once.
    await Promise.all(Array.from({ length: 2 }, (_, i) => ask("platinum", 100 + i)));
    const held = (await pool()).bands.find((b) => b.name === "platinum")!;
    expect(held).toMatchObject({ admitted: 2n, queued: 0n });
    let done = false;
    const all = Promise.all(bronze).finally(() => {
      done = true;
    });
    await waitUntil("every bronze stream served", async () => {
      await look();
      return done;
    });
    await all;
    expect(most, "streams prefilling at any poll").toBeLessThanOrEqual(4);
    // The Worker's first-token note is what let the next one in, not the release.
    expect(decoding, "a poll saw streams in flight past their first token").toBe(true);
    const b = await bronzeBand();
    expect(Number(b.admitted)).toBe(LONG);
    expect(Number(b.queued)).toBeGreaterThan(0);
    await waitUntil("every lease released", async () => (await pool()).leases === 0);
  }, 180_000);
});
