/**
 * The burst that once inverted the bands, on real processes, measured
 * three times in one run: the edge in workerd (Miniflare on a direct socket, as
 * bench:edge runs it: `wrangler dev`'s local proxy turns calls away under
 * 120 streams on these machines; its ModelPool included)
 * in front of 4 sim engines of 4 slots each at a quarter of real time, no
 * load feed. 10 platinum streams at once, alone (unloaded), then 120 bronze
 * streams at once and 10 platinum 2 s later. Once with the design before
 * capacity was known (`target_inflight: 128`, endpoints without capacity)
 * and with each endpoint's `max_num_seqs` and every admit charged its
 * demand: once counting half of each 4-slot batch (`seq_floor: 0`), and as
 * it is now, the whole of it (a batch under `seq_floor`). Each run gets
 * fresh engines and a fresh edge.
 *
 * Two clocks say when bronze reached its ceiling. The pool's status, polled
 * every 10 ms, or the first 429 sights when the pool first held a bronze
 * request back (it had the ceiling's worth admitted by then). The engines'
 * traces (--sim-trace) say exactly when the most bronze requests were at
 * the engines at once, which is later by the admitted requests' way from
 * the pool to their engine.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type OpenAI from "openai";
import { renderTable } from "../../common/text-table.ts";
import { ms, percentile } from "../../loadgen/stats.ts";
import {
  clientFor,
  createKey,
  type FastEdge,
  type Sim,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
  stopStarted,
} from "../../scripts/edge-harness.ts";
import { readTrace, wallMs } from "../../sim-engine/request-trace.ts";

const BRONZE = 120;
const PLATINUM = 10;
const HANG_MS = 90_000;

interface Outcome {
  status: number;
  code: string | null;
  retryAfter: boolean;
  ttftMs: number | null;
}

async function ask(openai: OpenAI, band: string, n: number): Promise<Outcome> {
  const t0 = performance.now();
  try {
    const stream = await openai.chat.completions.create(
      {
        model: "burst",
        messages: [{ role: "user", content: `${band} ${n} asks` }],
        // Matches the engines' trace records to the request.
        user: `${band}-${n}`,
        max_tokens: 16,
        stream: true,
      },
      { headers: { "x-llmgw-band": band }, signal: AbortSignal.timeout(HANG_MS) },
    );
    let ttftMs: number | null = null;
    for await (const c of stream)
      if (ttftMs === null && c.choices[0]?.delta.content) ttftMs = performance.now() - t0;
    return { status: 200, code: null, retryAfter: false, ttftMs };
  } catch (err) {
    const e = err as { status?: number; code?: string | null; headers?: Headers };
    if (e.status === undefined) return { status: 0, code: "hung or broken", retryAfter: false, ttftMs: null };
    return {
      status: e.status,
      code: e.code ?? null,
      retryAfter: Number(e.headers?.get("retry-after")) > 0,
      ttftMs: null,
    };
  }
}

const p99 = (xs: number[]) =>
  percentile(
    [...xs].sort((a, b) => a - b),
    99,
  ) ?? Number.NaN;

interface Run {
  design: string;
  /**
   * When bronze was first seen held back (in flight at its ceiling): the first
   * status poll showing it queued or refused, or the first 429, whichever came
   * first. Both are sightings, so the figure is an upper bound.
   */
  heldMs: number | null;
  ceilingMs: number | null;
  /** When the client had handed the last bronze request to fetch, after the burst began: its own share of the way. */
  sentWithinMs: number;
  /**
   * From the engines' traces: the most bronze requests at the engines at
   * once, when that many first were, and when the first one came (its way
   * through the client and the edge, before any admission held it).
   */
  atEngines: { most: number; firstAtMs: number | null; firstArrivalMs: number | null };
  unloadedP99: number;
  loadedP99: number;
  platinumServed: number;
  bronze: Outcome[];
}

/**
 * The most `band` requests at the engines at once (from arrival to end, in
 * the engines' own wall-clock traces) and when that many first were, in ms
 * after `t0`: exact where a status poll only sights.
 */
function mostAtEngines(traces: readonly string[], band: string, t0: number): Run["atEngines"] {
  const events: [number, 1 | -1][] = [];
  for (const file of traces)
    for (const [user, r] of readTrace(file))
      if (user.startsWith(`${band}-`)) events.push([r.arrived_ms, 1], [r.ended_ms, -1]);
  // An end and an arrival at the same instant: the end first, so nothing is counted twice.
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let now = 0;
  let most = 0;
  let firstAtMs: number | null = null;
  for (const [at, d] of events) {
    now += d;
    if (now > most) {
      most = now;
      firstAtMs = at - t0;
    }
  }
  const first = events.find((e) => e[1] === 1);
  return { most, firstAtMs, firstArrivalMs: first ? first[0] - t0 : null };
}

/** `scoring` is the router's; `known` whether the endpoints state their capacity. */
async function run(design: string, scoring: Record<string, number>, known: boolean): Promise<Run> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-real-burst-"));
  const traces = Array.from({ length: 4 }, (_, i) => join(dir, `trace-${i}.jsonl`));
  const [edge, ...sims] = (await Promise.all([
    startEdgeMiniflare({
      scoring,
      admission: { queue_ttl: "10s", queue_capacity_per_band: 50 },
    }),
    ...traces.map((t) => startSim("burst", ["--sim-speed", "0.25", "--max-num-seqs", "4", "--sim-trace", t])),
  ])) as [FastEdge, ...Sim[]];
  await setEndpoints(
    edge,
    sims.map((s, i) => ({
      id: `burst-${i}`,
      url: s.url,
      models: ["burst"],
      ...(known ? { capacity: { maxNumSeqs: 4 } } : {}),
    })),
  );
  // One client for the whole run, as an application keeps one: 120 built
  // one after another on this process's one thread would spread the
  // burst's start over the bench's own work.
  // Each bronze request's hand-off to fetch is stamped: how long the
  // client itself took to send the burst is part of the way to the engines.
  const bronzeSent: number[] = [];
  const openai = clientFor(edge, (await createKey(edge, { band: "platinum" })).secret, (url, init) => {
    if (new Headers(init?.headers).get("x-llmgw-band") === "bronze") bronzeSent.push(performance.now());
    return fetch(url, init);
  });
  // A first round warms the isolate, the pool and the engines, so that what
  // is measured alone is not a cold start (which would flatter the ratio).
  await Promise.all(Array.from({ length: PLATINUM }, (_, i) => ask(openai, "platinum", 200 + i)));
  // Alone as in the burst: all at once.
  const alone = await Promise.all(Array.from({ length: PLATINUM }, (_, i) => ask(openai, "platinum", i)));
  const unloaded = alone.map((o) => o.ttftMs ?? Number.POSITIVE_INFINITY);

  const t0 = performance.now();
  const t0Wall = wallMs();
  // The first refusal a client sees: the band's ceiling and its queue were
  // both reached by then.
  let ceilingMs: number | null = null;
  const bronze = Array.from({ length: BRONZE }, (_, i) =>
    ask(openai, "bronze", i).then((o) => {
      if (o.status === 429 && ceilingMs === null) ceilingMs = performance.now() - t0;
      return o;
    }),
  );
  let platinumSent = false;
  const platinum = new Promise<Outcome[]>((resolve) =>
    setTimeout(() => {
      platinumSent = true;
      resolve(Promise.all(Array.from({ length: PLATINUM }, (_, i) => ask(openai, "platinum", 100 + i))));
    }, 2_000),
  );
  // When the pool first held bronze back, as a status poll sees it: the
  // poll's own time, behind the burst on workerd's one thread, is in the
  // figure, so it reads late, never early.
  let heldMs: number | null = null;
  while (!platinumSent) {
    const p = (await edge.sync.getPoolStatus({ model: "burst" })).pools[0];
    const b = p?.bands.find((x) => x.name === "bronze");
    if (heldMs === null && b && b.queued + b.full > 0n) heldMs = performance.now() - t0;
    await new Promise((r) => setTimeout(r, 10));
  }
  const loaded = await platinum;
  const outcomes = await Promise.all(bronze);
  // Stopping the engines flushes their traces.
  await Promise.all([edge.stop(), ...sims.map((s) => s.stop())]);
  const result: Run = {
    design,
    // Either sighting proves bronze was held by then; the earlier is the closer bound.
    heldMs: heldMs === null ? ceilingMs : ceilingMs === null ? heldMs : Math.min(heldMs, ceilingMs),
    ceilingMs,
    sentWithinMs: Math.max(...bronzeSent) - t0,
    atEngines: mostAtEngines(traces, "bronze", t0Wall),
    unloadedP99: p99(unloaded),
    loadedP99: p99(loaded.map((o) => o.ttftMs ?? Number.POSITIVE_INFINITY)),
    platinumServed: loaded.filter((o) => o.status === 200).length,
    bronze: outcomes,
  };
  rmSync(dir, { recursive: true, force: true });
  return result;
}

export async function realBurst(): Promise<void> {
  process.stdout.write(
    `\n## real burst: ${BRONZE} bronze streams at once, ${PLATINUM} platinum 2 s later; 4 sim engines of 4 slots at 0.25× speed behind the edge in workerd\n\n`,
  );
  const runs: Run[] = [];
  try {
    runs.push(await run("before: target_inflight 128", { target_inflight: 128 }, false));
    runs.push(await run("capacity, demand, first tokens; half the batch", { seq_floor: 0 }, true));
    runs.push(await run("now: a batch under seq_floor counts whole", {}, true));
  } finally {
    await stopStarted();
  }
  const rows = runs.map((r) => {
    const count = (pred: (o: Outcome) => boolean) => String(r.bronze.filter(pred).length);
    return [
      r.design,
      r.atEngines.most >= BRONZE || r.atEngines.firstAtMs === null
        ? "no ceiling"
        : `${Math.round(r.atEngines.firstAtMs)} ms`,
      `${Math.round(r.sentWithinMs)} ms`,
      r.atEngines.firstArrivalMs === null ? "none" : `${Math.round(r.atEngines.firstArrivalMs)} ms`,
      String(r.atEngines.most),
      r.heldMs === null ? "never" : `${Math.round(r.heldMs)} ms`,
      r.ceilingMs === null ? "never" : `${Math.round(r.ceilingMs)} ms`,
      ms(r.unloadedP99 / 1000),
      ms(r.loadedP99 / 1000),
      `${(r.loadedP99 / r.unloadedP99).toFixed(2)}×`,
      `${r.platinumServed}/${PLATINUM}`,
      count((o) => o.status === 200),
      `${count((o) => o.status === 429)} (${count((o) => o.status === 429 && o.retryAfter)} with Retry-After)`,
      count((o) => o.status === 503),
      count((o) => o.status === 0),
    ];
  });
  process.stdout.write(
    `${renderTable(
      [
        "admission",
        "bronze at its ceiling after",
        "client sent all bronze within",
        "first bronze at an engine after",
        "bronze at the engines (max)",
        "bronze held after (poll)",
        "first bronze 429 after",
        "plat TTFT p99 alone",
        "plat TTFT p99 in burst",
        "÷",
        "plat served",
        "bronze 200",
        "bronze 429",
        "bronze 503",
        "hung/broken",
      ],
      rows,
    )}\n`,
  );
}
