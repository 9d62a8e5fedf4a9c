import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../config/router.ts";
import { plainEndpoint as ep } from "./plain-endpoint.ts";
import { type Admission, type AdmitRequest, type Lease, PoolCore } from "./pool-core.ts";
import { blockHashes } from "./prefix-hash.ts";
import type { EndpointSpec, LoadSample, RoutingPolicy } from "./types.ts";

function sample(at: number, extra: Partial<LoadSample> = {}): LoadSample {
  return { waiting: 0, running: 0, kvUsage: 0, prefixCacheHitRate: 0, at, state: "ready", ...extra };
}

function pool(n: number, router: Record<string, unknown> = {}, seed = 1) {
  const p = new PoolCore("m", routerSchema.parse(router), mulberry32(seed));
  p.setEndpoints(
    1,
    Array.from({ length: n }, (_, i) => ep(`e${i}`)),
    0,
  );
  return p;
}

let seq = 0;
function req(extra: Partial<AdmitRequest> = {}): AdmitRequest {
  return { id: `r${++seq}`, band: "gold", key: "k", policy: "chat", prefix: [], ...extra };
}

/** admit, with the answer captured: undefined while the request is queued. */
function admit(p: PoolCore, r: AdmitRequest, now: number) {
  const box: { a: Admission | undefined } = { a: undefined };
  p.admit(r, now, (a) => {
    box.a = a;
  });
  return box;
}

function leaseOf(box: { a: Admission | undefined }): Lease {
  if (!box.a?.ok) throw new Error(`expected a lease, got ${JSON.stringify(box.a)}`);
  return box.a.lease;
}

const inflight = (p: PoolCore, now = 0) => p.status(now).endpoints.map((e) => e.inflight);

describe("PoolCore admission from the first request of a burst", () => {
  const capped = (n: number, capacity: EndpointSpec["capacity"], router: Record<string, unknown> = {}) => {
    const p = new PoolCore("m", routerSchema.parse(router), mulberry32(1));
    p.setEndpoints(
      1,
      Array.from({ length: n }, (_, i) => ep(`e${i}`, { capacity })),
      0,
    );
    return p;
  };

  it("holds a bronze burst at its ceiling from the first request, and platinum arriving after it goes at once", () => {
    // The burst that inverted the bands on real processes: 4 engines of 4
    // slots, 120 bronze streams at once, a queue of 50, platinum 2 s later.
    const p = capped(4, { maxSeqs: 4 }, { admission: { queue_capacity_per_band: 50, queue_ttl: "10s" } });
    const bronze = Array.from({ length: 120 }, (_, i) => admit(p, req({ band: "bronze", key: `k${i}` }), 0));
    const admitted = bronze.filter((b) => b.a?.ok).length;
    const full = bronze.filter((b) => b.a && !b.a.ok && b.a.code === "queue_full").length;
    // A batch of 4 is under seq_floor, so all 4 slots count: 16 in the
    // fleet, bronze's 0.30 of them 4.8, the fifth goes at 0.25.
    expect(admitted).toBe(5);
    expect(full).toBe(120 - 5 - 50);
    expect(p.status(0).bands.find((b) => b.name === "bronze")).toMatchObject({ depth: 50, admitted: 5 });
    const platinum = Array.from({ length: 11 }, () => admit(p, req({ band: "platinum" }), 2_000));
    expect(platinum.every((b) => b.a?.ok)).toBe(true);
    // Platinum takes the room up to its ceiling: 16 in flight, every slot, saturation 1.0.
    expect(inflight(p, 2_000)).toEqual([4, 4, 4, 4]);
    expect(admit(p, req({ band: "platinum" }), 2_000).a).toBeUndefined();
  });

  it("charges each request's predicted tokens against the KV cache and frees them at release", () => {
    const p = capped(1, { maxSeqs: 256, kvTokens: 10_000 }, { scoring: { kv_ceiling: 1 } });
    const demand = { promptTokens: 3_000, outputTokens: 1_000 };
    const a = leaseOf(admit(p, req({ band: "gold", demand }), 0));
    leaseOf(admit(p, req({ band: "gold", demand }), 0));
    expect(p.status(0).endpoints[0]).toMatchObject({ tokens: 8_000, saturation: 0.8, kvTokens: 10_000 });
    // 0.8 < 0.85: a third gold goes (1.2 now); a fourth waits for a release.
    leaseOf(admit(p, req({ band: "gold", demand }), 0));
    const waiting = admit(p, req({ band: "gold", demand }), 0);
    expect(waiting.a).toBeUndefined();
    p.release(a.id, { attempts: [{ endpoint: "e0", verdict: "ok" }] }, 1);
    expect(waiting.a?.ok).toBe(true);
    expect(p.status(1).endpoints[0]?.tokens).toBe(12_000);
  });

  it("charges a prompt less the leading blocks the endpoint already caches", () => {
    const p = capped(1, { maxSeqs: 256, kvTokens: 100_000 });
    const prefix = blockHashes("x".repeat(64 * 10), "m");
    const demand = { promptTokens: 200, outputTokens: 100 };
    leaseOf(admit(p, req({ prefix, demand }), 0));
    expect(p.status(0).endpoints[0]?.tokens).toBe(300);
    // The second finds all 10 blocks of 16 tokens cached, and the 40 past them (the template's) taken as cached too.
    leaseOf(admit(p, req({ prefix, demand }), 0));
    expect(p.status(0).endpoints[0]?.tokens).toBe(300 + 100);
  });

  it("takes a prompt past the hashed head as cached in the head's proportion", () => {
    const p = capped(1, { maxSeqs: 256, kvTokens: 1_000_000 });
    // An 8,000-token system prompt: only its first 4,096 tokens (256 blocks) are hashed.
    const system = "s".repeat(32_000);
    const prefix = blockHashes(system, "m");
    expect(prefix).toHaveLength(256);
    const demand = { promptTokens: 8_300, outputTokens: 200 };
    leaseOf(admit(p, req({ prefix, demand }), 0));
    expect(p.status(0).endpoints[0]?.tokens).toBe(8_500);
    // Its next turn finds the whole head held: charged its answer, not the 4,204 tokens past the head.
    leaseOf(admit(p, req({ prefix, demand }), 0));
    expect(p.status(0).endpoints[0]?.tokens).toBe(8_500 + 200);
  });

  it("holds a burst of streams on a large batch while they wait for their first token, and lets the next go at each first token", () => {
    // Batch 256: by sequences the burst is nowhere near full, but each
    // engine runs prefills oldest first, so what waits for its first token
    // is the queue a platinum prompt would join.
    const p = capped(2, { maxSeqs: 256 });
    const demand = { promptTokens: 1_024, outputTokens: 200, reportsFirstToken: true };
    const bronze = Array.from({ length: 10 }, (_, i) =>
      admit(p, req({ band: "bronze", key: `k${i}`, demand }), 0),
    );
    const granted = bronze.filter((b) => b.a?.ok);
    // target_prefilling 2 an engine: bronze's 0.30 of 2 engines holds 2 (the second at 0.25).
    expect(granted.length).toBe(2);
    expect(p.status(0).endpoints.map((e) => e.prefilling)).toEqual([1, 1]);
    p.prefilled(leaseOf(granted[0]!).id, 10);
    expect(bronze.filter((b) => b.a?.ok).length).toBe(3);
    // A first token frees the queue, not the sequence: it stays in flight until the release.
    expect(p.status(10).endpoints.reduce((n, e) => n + e.inflight, 0)).toBe(3);
    // A second report, or one after the release, changes nothing.
    p.prefilled(leaseOf(granted[0]!).id, 11);
    expect(bronze.filter((b) => b.a?.ok).length).toBe(3);
    // Platinum goes at once through bronze's queue.
    expect(admit(p, req({ band: "platinum", demand }), 12).a?.ok).toBe(true);
  });

  it("asks for a stream's first token at once only near the lowest ceiling or while a band waits", () => {
    const p = capped(4, { maxSeqs: 256 });
    const demand = { promptTokens: 1_024, outputTokens: 200, reportsFirstToken: true };
    // Idle: the note may ride with the isolate's next call.
    expect(leaseOf(admit(p, req({ band: "gold", demand }), 0)).firstTokenNote).toBe("with-next-call");
    // 1 of 8 prefilling places taken (0.125): under half of bronze's 0.30 still; at 2 (0.25), past it.
    expect(leaseOf(admit(p, req({ band: "gold", demand }), 0)).firstTokenNote).toBe("with-next-call");
    expect(leaseOf(admit(p, req({ band: "gold", demand }), 0)).firstTokenNote).toBe("now");
    // A band waiting behind it: at once.
    const q = capped(1, { maxSeqs: 256 });
    leaseOf(admit(q, req({ band: "gold", demand }), 0));
    expect(admit(q, req({ band: "bronze", demand }), 0).a).toBeUndefined();
    expect(leaseOf(admit(q, req({ band: "platinum", demand }), 0)).firstTokenNote).toBe("now");
    expect(
      leaseOf(admit(p, req({ band: "gold", demand: { ...demand, reportsFirstToken: false } }), 0))
        .firstTokenNote,
    ).toBeUndefined();
  });

  it("weighs a short prompt as a fraction of one: a crowd of them is no queue", () => {
    const p = capped(1, { maxSeqs: 256 });
    // Sixteen 64-token prompts at once, as a lockstep of short chats brings them: one engine step, a sixteenth of a queue each.
    const short = { promptTokens: 64, outputTokens: 16, reportsFirstToken: true };
    const all = Array.from({ length: 16 }, () => admit(p, req({ band: "gold", demand: short }), 0));
    expect(all.every((b) => b.a?.ok)).toBe(true);
    expect(p.status(0).endpoints[0]).toMatchObject({ inflight: 16, prefilling: 16 });
    expect(p.status(0).endpoints[0]?.saturation).toBeCloseTo(0.5);
    // Long prompts count one each however long: two fill the endpoint.
    const q = capped(1, { maxSeqs: 256 });
    const long = { promptTokens: 30_000, outputTokens: 16, reportsFirstToken: true };
    leaseOf(admit(q, req({ band: "platinum", demand: long }), 0));
    expect(q.status(0).endpoints[0]?.saturation).toBeCloseTo(0.5);
  });

  it("a request whose first token nobody reports (not a stream) never counts as prefilling", () => {
    const p = capped(1, { maxSeqs: 256 });
    const whole = { promptTokens: 1_000, outputTokens: 200 };
    for (let i = 0; i < 5; i++) leaseOf(admit(p, req({ band: "bronze", demand: whole }), 0));
    expect(p.status(0).endpoints[0]).toMatchObject({ inflight: 5, prefilling: 0 });
  });

  it("the release frees a stream still prefilling", () => {
    const p = capped(1, { maxSeqs: 256 });
    const demand = { promptTokens: 1_024, outputTokens: 200, reportsFirstToken: true };
    const l = leaseOf(admit(p, req({ demand }), 0));
    expect(p.status(0).endpoints[0]?.prefilling).toBe(1);
    p.release(l.id, { attempts: [{ endpoint: "e0", verdict: "fail" }] }, 1);
    expect(p.status(1).endpoints[0]).toMatchObject({ inflight: 0, prefilling: 0 });
  });

  it("a request without a predicted demand is charged assumed_output_tokens", () => {
    const p = capped(1, { kvTokens: 10_000 }, { scoring: { assumed_output_tokens: 700 } });
    leaseOf(admit(p, req(), 0));
    expect(p.status(0).endpoints[0]?.tokens).toBe(700);
  });
});

describe("PoolCore admission by band", () => {
  it("holds a band over its ceiling and lets it go when a release brings saturation down", () => {
    // One endpoint, 10 in flight = saturation 1.0 at target_inflight 10.
    const p = pool(1, { scoring: { target_inflight: 10 } });
    const leases = Array.from({ length: 8 }, () => leaseOf(admit(p, req({ band: "platinum" }), 0)));
    // 0.8 < gold's 0.85: gold goes; then 0.9.
    expect(admit(p, req({ band: "gold" }), 0).a?.ok).toBe(true);
    const gold = admit(p, req({ band: "gold" }), 0);
    expect(gold.a).toBeUndefined();
    const bronze = admit(p, req({ band: "bronze" }), 0);
    expect(bronze.a).toBeUndefined();
    p.release(leases[0]!.id, { attempts: [{ endpoint: "e0", verdict: "ok" }] }, 1);
    // 0.8 again: gold's waiter goes, bronze (0.3) still waits.
    expect(gold.a?.ok).toBe(true);
    expect(bronze.a).toBeUndefined();
    for (const l of leases.slice(1)) p.release(l.id, { attempts: [{ endpoint: "e0", verdict: "ok" }] }, 2);
    // Two gold leases remain: 0.2 < 0.3.
    expect(bronze.a?.ok).toBe(true);
    const st = p.status(2);
    expect(st.bands.find((b) => b.name === "gold")).toMatchObject({ admitted: 2, queued: 1, depth: 0 });
  });

  it("a request queued past queue_ttl gets 503 queue_timeout; a full band gets 429", () => {
    const p = pool(1, {
      scoring: { target_inflight: 1 },
      admission: { queue_ttl: "5s", queue_capacity_per_band: 1 },
    });
    leaseOf(admit(p, req({ band: "platinum" }), 0));
    const waiting = admit(p, req({ band: "silver" }), 0);
    const full = admit(p, req({ band: "silver" }), 0);
    expect(full.a).toMatchObject({ ok: false, status: 429, code: "queue_full" });
    expect(p.nextWakeAt()).toBe(1_000);
    p.tick(4_999);
    expect(waiting.a).toBeUndefined();
    p.tick(5_000);
    expect(waiting.a).toMatchObject({ ok: false, status: 503, code: "queue_timeout" });
    expect(p.status(5_000).bands.find((b) => b.name === "silver")).toMatchObject({ expired: 1, full: 1 });
  });

  it("a client that leaves while queued is dropped without dispatch", () => {
    const p = pool(1, { scoring: { target_inflight: 1 } });
    const first = leaseOf(admit(p, req({ band: "platinum" }), 0));
    const r = req({ band: "gold" });
    const box = admit(p, r, 0);
    p.abandon(r.id, 1);
    expect(box.a).toMatchObject({ ok: false, code: "abandoned" });
    p.release(first.id, { attempts: [{ endpoint: "e0", verdict: "ok" }] }, 2);
    expect(inflight(p)).toEqual([0]);
  });

  it("no endpoints: 503 no_endpoints at once; all breakers open: 503 no_capacity", () => {
    const empty = new PoolCore("m", routerSchema.parse({}), mulberry32(1));
    expect(admit(empty, req(), 0).a).toMatchObject({ status: 503, code: "no_endpoints" });
    const p = pool(1, { failure_threshold: 1, cooldown: "10s" });
    const l = leaseOf(admit(p, req(), 0));
    p.release(l.id, { attempts: [{ endpoint: "e0", verdict: "fail" }] }, 1);
    expect(admit(p, req(), 2).a).toMatchObject({ status: 503, code: "no_capacity" });
    // After the cooldown one probe goes through; a second waits for its verdict.
    expect(admit(p, req(), 10_001).a?.ok).toBe(true);
    expect(admit(p, req(), 10_002).a).toMatchObject({ code: "no_capacity" });
    // Each refusal is counted in its band, and the open breaker says why.
    const gold = (q: PoolCore) => q.status(10_003).bands.find((b) => b.name === "gold")!;
    expect(gold(empty)).toMatchObject({ noEndpoints: 1, noCapacity: 0 });
    expect(gold(p)).toMatchObject({ noEndpoints: 0, noCapacity: 2 });
  });

  it("an opening breaker is reported with its reason, and the pool's status carries it", () => {
    const p = pool(1, { failure_threshold: 2, cooldown: "10s" });
    const fail = (now: number) =>
      p.release(
        leaseOf(admit(p, req(), now)).id,
        { attempts: [{ endpoint: "e0", verdict: "fail", reason: `upstream_disconnected: cut ${now}` }] },
        now + 1,
      );
    expect(fail(0)).toEqual([]);
    expect(fail(2)).toEqual([{ endpoint: "e0", failures: 2, reason: "upstream_disconnected: cut 2" }]);
    expect(p.status(4).endpoints[0]).toMatchObject({
      breaker: "open",
      breakerReason: "upstream_disconnected: cut 2",
    });
  });

  it("a breaker's probe whose lease is never released frees the probe slot when the lease expires", () => {
    const p = pool(1, { failure_threshold: 1, cooldown: "10s", timeouts: { total: "1m" } });
    p.release(leaseOf(admit(p, req(), 0)).id, { attempts: [{ endpoint: "e0", verdict: "fail" }] }, 1);
    expect(admit(p, req(), 10_001).a?.ok).toBe(true); // the probe, never released
    expect(admit(p, req(), 10_002).a).toMatchObject({ code: "no_capacity" });
    p.tick(10_001 + 120_000);
    expect(admit(p, req(), 10_001 + 120_001).a?.ok).toBe(true);
  });

  it("an unreleased lease expires after the longest a request may run", () => {
    const p = pool(2, { timeouts: { total: "1m" } });
    leaseOf(admit(p, req(), 0));
    expect(inflight(p).reduce((a, b) => a + b)).toBe(1);
    p.tick(119_999);
    expect(inflight(p).reduce((a, b) => a + b)).toBe(1);
    p.tick(120_000);
    expect(inflight(p)).toEqual([0, 0]);
  });
});

describe("PoolCore load and staleness", () => {
  it("a stale signal decays toward saturated, and a feed that went silent everywhere is ignored", () => {
    const p = pool(2, { stale_after: "10s", scoring: { target_waiting: 4 } });
    p.updateLoad(
      [
        { endpoint: "e0", sample: sample(0, { waiting: 0 }) },
        { endpoint: "e1", sample: sample(0, { waiting: 2 }) },
      ],
      0,
    );
    expect(p.status(5_000).saturation).toBeCloseTo(0.25);
    // e1 keeps reporting; e0 went quiet 15 s ago: halfway to 1.0.
    p.updateLoad([{ endpoint: "e1", sample: sample(15_000, { waiting: 2 }) }], 15_000);
    const at15 = p.status(15_000);
    expect(at15.endpoints.map((e) => e.saturation)).toEqual([0.5, 0.5]);
    // 20 s after its last sample e0 counts as saturated.
    p.updateLoad([{ endpoint: "e1", sample: sample(20_000, { waiting: 2 }) }], 20_000);
    expect(p.status(20_000).endpoints[0]!.saturation).toBe(1);
    // No fresh sample anywhere: the feed is down, in-flight alone counts.
    const quiet = p.status(31_000);
    expect(quiet.loadFeed).toBe("stale");
    expect(quiet.saturation).toBe(0);
  });

  it("sends nothing to an endpoint its engine reports saturated while another is not", () => {
    const p = pool(2, { admission: { enabled: false } });
    p.updateLoad(
      [
        { endpoint: "e0", sample: sample(0, { waiting: 6, kvUsage: 0.8 }) },
        { endpoint: "e1", sample: sample(0, { waiting: 0, kvUsage: 0.1 }) },
      ],
      0,
    );
    const picks = Array.from({ length: 6 }, () => leaseOf(admit(p, req(), 1)).endpoint.id);
    expect(picks.filter((x) => x === "e1").length).toBe(6);
  });

  it("does not herd onto the endpoint whose last scrape looked best: between scrapes its own counts decide", () => {
    const p = pool(4, { admission: { enabled: false } });
    p.updateLoad(
      ["e0", "e1", "e2", "e3"].map((e, i) => ({
        endpoint: e,
        sample: sample(0, { kvUsage: 0.1 + 0.2 * i }),
      })),
      0,
    );
    for (let i = 0; i < 200; i++) leaseOf(admit(p, req(), 1));
    const c = inflight(p);
    expect(Math.max(...c) / (200 / 4), `${c}`).toBeLessThanOrEqual(1.2);
  });
});

describe("PoolCore picking (chat)", () => {
  it("session: sticks to its endpoint, and lets go when it has factor × and three requests more than the pool's mean", () => {
    const p = pool(4, { scoring: { target_inflight: 100, session_load_factor: 1.25 } });
    const first = leaseOf(admit(p, req({ session: "s1" }), 0));
    expect(first.route).toBe("load");
    // In flight on the pinned endpoint k (others 0): mean k/4; it stays while
    // k ≤ max(1.25 × k/4, k/4 + 3), i.e. up to k = 4.
    for (let i = 0; i < 4; i++) {
      const l = leaseOf(admit(p, req({ session: "s1" }), i));
      expect([l.endpoint.id, l.route]).toEqual([first.endpoint.id, "session"]);
    }
    const moved = leaseOf(admit(p, req({ session: "s1" }), 5));
    expect(moved.endpoint.id).not.toBe(first.endpoint.id);
    expect(moved.route).toBe("load");
    // Re-pinned where it went.
    expect(leaseOf(admit(p, req({ session: "s1" }), 6)).endpoint.id).toBe(moved.endpoint.id);
  });

  it("prefix: a prompt goes where its blocks were recorded, and is released when that endpoint is saturated", () => {
    const p = pool(4, { scoring: { target_inflight: 4, session_load_factor: 100 } });
    const text = "You are the support agent of a company that sells GPUs. ".repeat(40);
    const prefix = blockHashes(text, "m");
    const a = leaseOf(admit(p, req({ prefix }), 0));
    expect(a.route).toBe("load");
    const b = leaseOf(admit(p, req({ prefix }), 1));
    expect([b.endpoint.id, b.route]).toEqual([a.endpoint.id, "prefix"]);
    // A prompt sharing less than half of its blocks is not a match.
    const other = blockHashes(text.slice(0, 640) + "x".repeat(2000), "m");
    expect(leaseOf(admit(p, req({ prefix: other }), 2)).route).toBe("load");
    // Fill the warm endpoint to saturation (4 in flight): the prompt goes elsewhere.
    while (inflight(p)[Number(a.endpoint.id.slice(1))]! < 4) {
      const l = leaseOf(admit(p, req({ prefix }), 3));
      if (l.endpoint.id !== a.endpoint.id) break;
    }
    const released = leaseOf(admit(p, req({ prefix }), 4));
    expect(released.endpoint.id).not.toBe(a.endpoint.id);
    expect(p.status(4).routes.prefix).toBeGreaterThan(0);
  });

  it("a burst of identical requests makes no hot spot: max over mean in-flight ≤ 1.5 across 8 endpoints", () => {
    const text = "Summarise the attached quarterly report for the board. ".repeat(60);
    const prefix = blockHashes(text, "m");
    for (let seed = 1; seed <= 20; seed++) {
      const p = pool(8, { scoring: { target_inflight: 256 } }, seed);
      for (let i = 0; i < 64; i++) leaseOf(admit(p, req({ prefix, session: undefined }), 0));
      const counts = inflight(p);
      const mean = counts.reduce((a, b) => a + b) / counts.length;
      expect(Math.max(...counts) / mean, `seed ${seed}: ${counts}`).toBeLessThanOrEqual(1.5);
    }
  });

  it("spill-over: the priority-1 spill group is used only while the priority-0 group is saturated", () => {
    const p = new PoolCore("m", routerSchema.parse({ scoring: { target_inflight: 2 } }), mulberry32(3));
    p.setEndpoints(
      1,
      [ep("h100-a", { spillGroup: "h100" }), ep("a100-a", { spillGroup: "a100", priority: 1 })],
      0,
    );
    const ids = Array.from({ length: 3 }, () => leaseOf(admit(p, req({ band: "platinum" }), 0)).endpoint.id);
    expect(ids).toEqual(["h100-a", "h100-a", "a100-a"]);
    expect(p.status(0).lastRejections).toEqual([
      { endpoint: "h100-a", stage: "spill-over", reason: "spill group h100 is saturated" },
    ]);
    expect(leaseOf(admit(p, req({ band: "platinum" }), 0)).alternates.map((e) => e.id)).toEqual(["h100-a"]);
  });

  it("weight: an endpoint of weight 3 takes about three times the traffic of weight 1", () => {
    const p = new PoolCore("m", routerSchema.parse({ scoring: { target_inflight: 1000 } }), mulberry32(9));
    p.setEndpoints(1, [ep("big", { weight: 3 }), ep("small")], 0);
    for (let i = 0; i < 400; i++) leaseOf(admit(p, req({ band: "platinum" }), 0));
    const [big, small] = inflight(p) as [number, number];
    expect(big / small).toBeGreaterThan(2.5);
    expect(big / small).toBeLessThan(3.5);
  });

  it("alternates are ranked for retries and exclude the chosen endpoint and open breakers", () => {
    const p = pool(4, { failure_threshold: 1, retries: 2 });
    const l = leaseOf(admit(p, req(), 0));
    p.release(l.id, { attempts: [{ endpoint: "e2", verdict: "fail" }] }, 1);
    for (let i = 0; i < 10; i++) {
      const x = leaseOf(admit(p, req(), 2));
      expect(x.alternates).toHaveLength(2);
      expect(x.alternates.map((e) => e.id)).not.toContain(x.endpoint.id);
      expect([x.endpoint.id, ...x.alternates.map((e) => e.id)]).not.toContain("e2");
    }
  });
});

describe("PoolCore baselines", () => {
  it.each<[RoutingPolicy, number]>([
    ["round-robin", 0],
    ["least-load", 0],
    ["random", 4],
  ])("%s spreads 40 requests over 4 endpoints (max - min ≤ %d)", (policy, slack) => {
    const p = pool(4, { scoring: { target_inflight: 1000 } }, 5);
    for (let i = 0; i < 40; i++) expect(leaseOf(admit(p, req({ policy }), 0)).route).toBe(policy);
    const c = inflight(p);
    expect(Math.max(...c) - Math.min(...c)).toBeLessThanOrEqual(slack === 0 ? 0 : 8);
  });

  it("round-robin takes the endpoints in order whatever their load", () => {
    const p = pool(3, { admission: { enabled: false } });
    p.updateLoad([{ endpoint: "e0", sample: sample(0, { waiting: 50 }) }], 0);
    const ids = Array.from(
      { length: 6 },
      () => leaseOf(admit(p, req({ policy: "round-robin" }), 1)).endpoint.id,
    );
    expect(ids).toEqual(["e0", "e1", "e2", "e0", "e1", "e2"]);
  });
});
