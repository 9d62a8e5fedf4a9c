import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type FastEdge,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * Four sim engines behind the edge in workerd (Miniflare on a direct socket:
 * `wrangler dev`'s local proxy answers a dropped connection with a 503 of
 * its own, which is not the edge's), overloaded by gold,
 * silver and bronze while platinum keeps asking. No load feed (no control
 * plane): the pool judges saturation by its own in-flight counts, 2 per
 * engine at target, so the overload is exact and small. What a test can
 * hold without timing anything: platinum is dispatched at once through it,
 * the lower bands are shed with the right statuses, and the pool's counters
 * equal what the clients saw (platinum's TTFT under load is bench:routing's).
 */
afterAll(stopStarted);

const TTL_MS = 3_000;
const HANG_MS = 20_000;

interface Result {
  band: string;
  status: number;
  code: string | null;
}

describe("bands under overload", () => {
  let edge: FastEdge;
  let key: TestKey;

  beforeAll(async () => {
    const started = await Promise.all([
      startEdgeMiniflare({
        scoring: { target_inflight: 2 },
        admission: { queue_ttl: `${TTL_MS}ms`, queue_capacity_per_band: 8 },
      }),
      ...Array.from({ length: 4 }, () => startSim("busy", ["--sim-speed", "0.25"])),
    ]);
    edge = started[0] as FastEdge;
    await setEndpoints(
      edge,
      started
        .slice(1)
        .map((s, i) => ({ id: `busy-${i}`, url: (s as { url: string }).url, models: ["busy"] })),
    );
    key = await createKey(edge, { band: "platinum" });
  }, 120_000);

  /** One streamed request in `band`, read to its end. */
  async function ask(band: string, prompt: string, maxTokens: number): Promise<Result> {
    const client = clientFor(edge, key.secret);
    try {
      const stream = await client.chat.completions.create(
        { model: "busy", messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, stream: true },
        { headers: { "x-llmgw-band": band }, signal: AbortSignal.timeout(HANG_MS) },
      );
      for await (const _ of stream) {
        // To the end: a stream cut short would throw here.
      }
      return { band, status: 200, code: null };
    } catch (err) {
      const e = err as { status?: number; code?: string | null; name?: string };
      if (e.name === "AbortError" || e.status === undefined) return { band, status: 0, code: "hang" };
      return { band, status: e.status, code: e.code ?? null };
    }
  }

  /** A ~2,000-token prompt no other request shares, so its prefill is never cached. */
  const long = (n: number) => `${n} ${"words to read before answering ".repeat(400)}`;

  async function platinum(n: number, from: number): Promise<Result[]> {
    const out: Result[] = [];
    for (let i = 0; i < n; i++) out.push(await ask("platinum", long(from + i), 2));
    return out;
  }

  it("dispatches platinum at once through the overload while bronze is shed with 429 or 503, and nothing hangs", async () => {
    const unloaded = await platinum(8, 0);
    expect(unloaded.map((r) => r.status)).toEqual(Array(8).fill(200));

    let stop = false;
    const filler: Result[] = [];
    const worker = async (band: string, w: number) => {
      for (let i = 0; !stop; i++) filler.push(await ask(band, `${band} ${w} ${i}`, 24));
    };
    const workers = [
      ...Array.from({ length: 6 }, (_, w) => worker("gold", w)),
      ...Array.from({ length: 6 }, (_, w) => worker("silver", w)),
      ...Array.from({ length: 14 }, (_, w) => worker("bronze", w)),
    ];
    // Measure platinum once the overload holds bronze back.
    await waitUntil("bronze queued", async () => {
      const { pools } = await edge.sync.getPoolStatus({ model: "busy" });
      return (pools[0]?.bands.find((x) => x.name === "bronze")?.depth ?? 0) > 0;
    });
    const loaded = await platinum(8, 100);
    stop = true;
    await Promise.all(workers);

    expect(loaded.map((r) => r.status)).toEqual(Array(8).fill(200));
    // Platinum never waited at the gateway behind the lower bands' work:
    // its TTFT is the engines' business (bench:routing measures it), its
    // admission is the pool's, and that is exact.
    const { pools: during } = await edge.sync.getPoolStatus({ model: "busy" });
    expect(during[0]!.bands.find((x) => x.name === "platinum")).toMatchObject({ admitted: 16n, queued: 0n });

    // Every request ended: served, or refused by the pool with the right status.
    const outcomes = new Set(filler.map((r) => `${r.status} ${r.code}`));
    for (const o of outcomes) expect(["200 null", "429 queue_full", "503 queue_timeout"]).toContain(o);
    const bronze = filler.filter((r) => r.band === "bronze");
    expect(bronze.filter((r) => r.status === 429 || r.status === 503).length).toBeGreaterThan(0);
    expect(filler.filter((r) => r.band === "gold").every((r) => r.status === 200)).toBe(true);

    // The pool counted what the clients saw.
    const { pools } = await edge.sync.getPoolStatus({ model: "busy" });
    const b = pools[0]!.bands.find((x) => x.name === "bronze")!;
    expect([Number(b.full), Number(b.expired)]).toEqual([
      bronze.filter((r) => r.code === "queue_full").length,
      bronze.filter((r) => r.code === "queue_timeout").length,
    ]);
  }, 120_000);
});
