/**
 * `npm run bench:scaling`: does scaling between replicas.min and max serve
 * a day as well as sizing every model for its peak, on fewer GPU-hours?
 *
 * Three models share 16 simulated GPUs (2 nodes × 8) for one day on a
 * virtual clock (bench/scaling/day-sim.ts: the edge's real pools, sim
 * engine cores, the control plane's real Scaler, plan and ReplicaTable).
 * Demand is shaped like a day: a quiet night at both ends, model A peaking
 * in the morning, B in the afternoon (the peaks do not coincide), C broad
 * and modest. The day is compressed into DAY_H hours (default 4) so it runs
 * in a minute or two; scaling keeps its real settings (60 s window, 30 s up
 * and 5 min down cool-downs) and every replica takes LOAD_S (default 120 s)
 * from placement to ready, so the ramps are steeper than a real day's.
 *
 * The engines: the sim's H100 core limited to 16 running sequences, with
 * weights reading 80 ms a step (a large model's pace) so a replica serves
 * a few requests a second; 32-token answers. Bands: 10 % platinum, 60 %
 * gold, 30 % bronze.
 *
 * Three fleets on the same arrivals: fixed min (1 each), fixed max where
 * the GPUs allow (6 + 6 + 4 = 16), and scaling (min 1; max 8, 8, 4;
 * priorities A 10, B 5, C 0). Printed per fleet: the share of requests
 * served with TTFT within the target (all, and platinum + gold), the share
 * of 5-minute windows per model whose platinum and gold requests meet TTFT
 * p90 ≤ target with none shed (the SLO: bronze's ceiling of 0.30 holds it
 * back at any load a scaling target aims for, by design), platinum's p99,
 * requests shed (429/503; bronze's in brackets), GPU-hours, and scale
 * events per hour.
 *
 * Each engine's capacity (16 sequences, its KV tokens) reaches the pools
 * with the endpoint set, as the control plane publishes it, and the router's
 * `scoring.seq_ceiling` is 1 (below, why); the band ceilings then hold
 * bronze back at peaks in every fleet (the sheds below are mostly bronze's).
 *
 * Env: DAY_H (4), LOAD_S (120), SEED (1), TTFT_S (2), SCALING (the scaling
 * fleet's `scaling:` section as JSON, e.g. '{"target_saturation":0.5}').
 */
import { renderTable } from "../common/text-table.ts";
import { percentile } from "../loadgen/stats.ts";
import { DEFAULT_H100_8B_CORE, type EngineCoreConfig } from "../sim-engine/engine-core.ts";
import { numberKnob, objectKnob } from "./knobs.ts";
import { type DayModel, type DayResult, simulateDay } from "./scaling/day-sim.ts";

const DAY_MS = numberKnob("DAY_H", 4, 1) * 3_600_000;
const LOAD_MS = numberKnob("LOAD_S", 120) * 1000;
const SEED = numberKnob("SEED", 1);
const TTFT_MS = numberKnob("TTFT_S", 2) * 1000;
const BUCKET_MS = 5 * 60_000;
/** The scaling section for the scaling fleet, as JSON (default: the config defaults). */
const SCALING = objectKnob("SCALING");

const CORE: EngineCoreConfig = {
  ...DEFAULT_H100_8B_CORE,
  maxNumSeqs: 16,
  latency: { ...DEFAULT_H100_8B_CORE.latency, weightsReadMs: 80 },
};

/** Base rate all day, plus a bell around `centre` (a fraction of the day). */
function dayShape(base: number, peak: number, centre: number, width: number) {
  return (t: number) => base + peak * Math.exp(-(((t / DAY_MS - centre) / width) ** 2));
}

const shapes = {
  A: { rate: dayShape(0.5, 28, 0.3, 0.08), peakRate: 28.5, priority: 10 },
  B: { rate: dayShape(0.5, 28, 0.68, 0.08), peakRate: 28.5, priority: 5 },
  C: { rate: dayShape(0.5, 10, 0.5, 0.22), peakRate: 10.5, priority: 0 },
};

function fleet(bounds: Record<keyof typeof shapes, [number, number]>): DayModel[] {
  return (Object.keys(shapes) as (keyof typeof shapes)[]).map((name) => ({
    name,
    ...shapes[name],
    min: bounds[name][0],
    max: bounds[name][1],
  }));
}

const FLEETS: { name: string; models: DayModel[] }[] = [
  { name: "fixed min", models: fleet({ A: [1, 1], B: [1, 1], C: [1, 1] }) },
  { name: "fixed max", models: fleet({ A: [6, 6], B: [6, 6], C: [4, 4] }) },
  { name: "scaling", models: fleet({ A: [1, 8], B: [1, 8], C: [1, 4] }) },
];

interface Row {
  fleet: string;
  withinTarget: number;
  sloWithinTarget: number;
  windowsMet: number;
  platinumP99: number | null;
  shed: number;
  bronzeShed: number;
  gpuHours: number;
  eventsPerHour: number;
  maxModelEventsPerHour: number;
  requests: number;
  seconds: number;
}

/** Bands whose saturation ceiling is above any sensible scaling target: the SLO is theirs. */
const SLO_BANDS = new Set(["platinum", "gold"]);

function summarise(name: string, r: DayResult, seconds: number): Row {
  const ttft = (q: DayResult["requests"][number]) =>
    q.status === 200 && q.firstToken !== undefined ? q.firstToken - q.arrival : Number.POSITIVE_INFINITY;
  const slo = r.requests.filter((q) => SLO_BANDS.has(q.band));
  const platinum = r.requests
    .filter((q) => q.band === "platinum")
    .map(ttft)
    .sort((a, b) => a - b);
  const buckets = new Map<string, number[]>();
  for (const q of slo) {
    const k = `${q.model}/${Math.floor(q.arrival / BUCKET_MS)}`;
    const list = buckets.get(k) ?? [];
    list.push(ttft(q));
    buckets.set(k, list);
  }
  let met = 0;
  for (const list of buckets.values()) {
    list.sort((a, b) => a - b);
    const p90 = percentile(list, 90);
    if (p90 !== null && p90 <= TTFT_MS && Number.isFinite(list[list.length - 1]!)) met++;
  }
  const hours = DAY_MS / 3_600_000;
  const perModel = new Map<string, number>();
  for (const e of r.events) perModel.set(e.model, (perModel.get(e.model) ?? 0) + 1);
  const p99 = percentile(platinum, 99);
  return {
    fleet: name,
    withinTarget: r.requests.filter((q) => ttft(q) <= TTFT_MS).length / r.requests.length,
    sloWithinTarget: slo.filter((q) => ttft(q) <= TTFT_MS).length / slo.length,
    windowsMet: met / buckets.size,
    platinumP99: p99 === null || !Number.isFinite(p99) ? null : p99,
    shed: r.requests.filter((q) => q.status === 429 || q.status === 503).length,
    bronzeShed: r.requests.filter((q) => q.band === "bronze" && (q.status === 429 || q.status === 503))
      .length,
    gpuHours: r.gpuMs / 3_600_000,
    eventsPerHour: r.events.length / hours,
    maxModelEventsPerHour: Math.max(0, ...perModel.values()) / hours,
    requests: r.requests.length,
    seconds,
  };
}

const rows: Row[] = [];
for (const f of FLEETS) {
  const started = performance.now();
  const r = simulateDay({
    models: f.models,
    nodes: 2,
    gpusPerNode: 8,
    durationMs: DAY_MS,
    loadMs: LOAD_MS,
    core: CORE,
    scaling: SCALING,
    // The whole batch: the default half (seq_ceiling 0.5) is where a
    // batch-256 8B engine's step has slowed 2.5× (docs/routing.md), but
    // these engines' steps are mostly the 80 ms weight read, so 16 running
    // cost little more than 8. At 0.5 gold
    // (ceiling 0.85) is held at 6.8 of each engine's 16 slots: seed 1 then
    // gave fixed max 90.3 % of windows meeting the SLO (97.9 % here) with
    // 5,745 platinum and gold requests shed, and scaling 35.5 GPU-hours
    // (30.9 here) for the same 97.9 %. With capacity published this does what
    // `target_inflight: 16` did before, and the figures are the same.
    router: { scoring: { seq_ceiling: 1 } },
    outputTokens: 32,
    bands: { platinum: 0.1, gold: 0.6, bronze: 0.3 },
    seed: SEED,
  });
  rows.push(summarise(f.name, r, (performance.now() - started) / 1000));
  process.stderr.write(`${f.name}: simulated in ${rows.at(-1)!.seconds.toFixed(0)} s\n`);
}

const pct = (x: number) => `${(x * 100).toFixed(1)} %`;
process.stdout.write(
  `\nA day of ${DAY_MS / 3_600_000} h on 16 GPUs, replicas loading in ${LOAD_MS / 1000} s, TTFT target ${TTFT_MS / 1000} s, seed ${SEED}\n\n`,
);
process.stdout.write(
  renderTable(
    [
      "FLEET",
      "REQUESTS",
      "TTFT<=TARGET",
      "P+G TTFT<=TARGET",
      "P+G 5-MIN WINDOWS MET",
      "PLATINUM P99",
      "SHED (BRONZE)",
      "GPU-HOURS",
      "EVENTS/H",
      "MAX/MODEL/H",
    ],
    rows.map((r) => [
      r.fleet,
      String(r.requests),
      pct(r.withinTarget),
      pct(r.sloWithinTarget),
      pct(r.windowsMet),
      r.platinumP99 === null ? "-" : `${(r.platinumP99 / 1000).toFixed(2)} s`,
      `${r.shed} (${r.bronzeShed})`,
      r.gpuHours.toFixed(1),
      r.eventsPerHour.toFixed(1),
      r.maxModelEventsPerHour.toFixed(1),
    ]),
  ),
);
const max = rows.find((r) => r.fleet === "fixed max")!;
const sc = rows.find((r) => r.fleet === "scaling")!;
process.stdout.write(
  `\nscaling against fixed max: ${pct(1 - sc.gpuHours / max.gpuHours)} fewer GPU-hours; ` +
    `5-minute windows meeting the platinum + gold SLO ${pct(sc.windowsMet)} against ${pct(max.windowsMet)}; ` +
    `at most ${sc.maxModelEventsPerHour.toFixed(1)} scale events per model per hour\n`,
);
