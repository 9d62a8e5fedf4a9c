/**
 * `npm run bench:routing`: does the router core route better than the
 * baselines, and what does one decision cost?
 *
 * 1. Simulation. The edge's real routing modules (PoolCore) in front of 8
 *    sim engine cores (Llama-3.1-8B on one H100 each, the recalibrated
 *    model) on a virtual clock (bench/routing/fleet-sim.ts), with load
 *    scraped every 2 s and pushed every 1 s as deployed. Three workloads,
 *    every policy on each, Poisson sweeps:
 *    - shared prefix: 150 groups of 8k-token system prompts, 5 users each,
 *      5-turn conversations (300-token questions, 200-token answers): the
 *      prompts exceed one engine's KV cache ~3× and fit the fleet's;
 *    - low sharing: random 1k-token prompts, 200-token answers;
 *    - band mix: the low-sharing load, 10 % platinum, 30 % gold, silver and
 *      bronze each, at 1.6× the fleet's knee, beside the same mix unloaded.
 *    Knee: the highest offered rate with every measured request served and
 *    TTFT p90 ≤ 2 s. Warm-up (the first 30 s) is not measured.
 * 2. One pick: PoolCore.admit + release at 64 endpoints with a full prefix
 *    index, as the ModelPool runs it for every request; and a request's
 *    two calls to a real ModelPool in workerd (bench/routing/pool-rtt.ts).
 * 3. Real processes: the shared-prefix workload scaled down, through
 *    `wrangler dev` onto 4 sim engines, `llmgw bench` against `chat` and
 *    `round-robin` (bench/routing/real.ts).
 *
 * 4. Bursts: bronze stepping from idle to a multiple of the fleet, platinum
 *    after it, with capacity known and before (bench/routing/burst.ts on
 *    the simulated fleet, bench/routing/real-burst.ts through `wrangler
 *    dev`).
 *
 * Env: PARTS (sim,burst,pick,rtt,isolates,real,real-burst), QUICK=1 (shorter windows, fewer levels),
 * MEASURE_S (120), SEED (1). Plots go to bench/out/.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { renderTable } from "../common/text-table.ts";
import { type RouterConfig, routerSchema } from "../edge/config/router.ts";
import type { RoutingPolicy } from "../edge/routing/types.ts";
import { loadFigure } from "../loadgen/plot.ts";
import { type LevelSummary, ms } from "../loadgen/stats.ts";
import { bandMix, DEFAULT_BANDS, randomPrompts, sharedPrefix, type Workload } from "../loadgen/workloads.ts";
import { DEFAULT_H100_8B_CORE } from "../sim-engine/engine-core.ts";
import { numberKnob } from "./knobs.ts";
import { runBurst } from "./routing/burst.ts";
import { knee, type Level, runLevel } from "./routing/levels.ts";
import { pickBenchmark } from "./routing/pick.ts";
import { poolIsolates } from "./routing/pool-isolates.ts";
import { poolRoundTrip } from "./routing/pool-rtt.ts";
import { realConfirmation } from "./routing/real.ts";
import { realBurst } from "./routing/real-burst.ts";

const QUICK = process.env.QUICK === "1";
const PARTS = new Set((process.env.PARTS ?? "sim,burst,pick,rtt,isolates,real,real-burst").split(","));
const MEASURE_S = numberKnob("MEASURE_S", QUICK ? 60 : 120, 1);
const WARMUP_S = 30;
const SEED = numberKnob("SEED", 1);
const ENGINES = 8;
const TTFT_SLO_S = 2;
const POLICIES: RoutingPolicy[] = ["chat", "least-load", "random", "round-robin"];
const OUT = join(import.meta.dirname, "out");

const SHARED = sharedPrefix({
  groups: 150,
  usersPerGroup: 5,
  systemTokens: 8000,
  questionTokens: 300,
  outputTokens: 200,
  turns: 5,
  ignoreEos: true,
});
const RANDOM = randomPrompts({ promptTokens: 1000, spread: 0.5, outputTokens: 200, ignoreEos: true });

const settings: RouterConfig = routerSchema.parse({});

function level(workload: Workload, policy: RoutingPolicy, rate: number, s = settings): Level {
  return runLevel({
    workload,
    policy,
    rate,
    engines: ENGINES,
    core: DEFAULT_H100_8B_CORE,
    settings: s,
    warmupS: WARMUP_S,
    measureS: MEASURE_S,
    seed: SEED,
  });
}

const keepsUp = (l: Level) =>
  l.summary.successRate >= 0.99 && l.summary.ttft.p90 !== null && l.summary.ttft.p90 <= TTFT_SLO_S;

/** Each policy up its own sweep, stopping two levels past where it stopped keeping up. */
function sweep(workload: Workload, rates: number[]): Map<RoutingPolicy, Level[]> {
  const out = new Map<RoutingPolicy, Level[]>();
  for (const policy of POLICIES) {
    const levels: Level[] = [];
    let behind = 0;
    for (const rate of rates) {
      const t0 = performance.now();
      const l = level(workload, policy, rate);
      levels.push(l);
      process.stderr.write(
        `  ${workload.name} ${policy} ${rate}/s: ${Math.round(l.summary.outputTokensPerSecond)} tok/s, TTFT p90 ${ms(l.summary.ttft.p90)} (${((performance.now() - t0) / 1000).toFixed(1)} s)\n`,
      );
      behind = keepsUp(l) ? 0 : behind + 1;
      if (behind >= 2) break;
    }
    out.set(policy, levels);
  }
  return out;
}

const pct = (x: number) => `${(x * 100).toFixed(1)} %`;

function row(policy: string, l: Level): string[] {
  const s = l.summary;
  const routes = Object.entries(s.routes ?? {})
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
  return [
    policy,
    String(l.spec.rate),
    String(Math.round(s.outputTokensPerSecond)),
    ms(s.ttft.p50),
    ms(s.ttft.p90),
    ms(s.ttft.p99),
    ms(s.itl.p90),
    pct(s.successRate),
    pct(l.hitRate),
    l.spread.toFixed(2),
    routes,
  ];
}

const HEAD = [
  "policy",
  "req/s",
  "out tok/s",
  "TTFT p50",
  "TTFT p90",
  "TTFT p99",
  "ITL p90",
  "success",
  "prefix hits",
  "max/mean",
  "decided by",
];

function report(title: string, runs: Map<RoutingPolicy, Level[]>): Map<RoutingPolicy, Level | undefined> {
  process.stdout.write(`\n## ${title}\n\n`);
  const rows: string[][] = [];
  const knees = new Map<RoutingPolicy, Level | undefined>();
  for (const [policy, levels] of runs) {
    for (const l of levels) rows.push(row(policy, l));
    knees.set(policy, knee(levels, TTFT_SLO_S));
  }
  process.stdout.write(`${renderTable(HEAD, rows)}\n\nknees (TTFT p90 ≤ ${TTFT_SLO_S} s, success ≥ 99 %):\n`);
  for (const [policy, k] of knees) {
    process.stdout.write(
      `  ${policy.padEnd(12)} ${k ? `${k.spec.rate} req/s, ${Math.round(k.summary.outputTokensPerSecond)} out tok/s` : "none in the sweep"}\n`,
    );
  }
  return knees;
}

function plot(name: string, runs: Map<RoutingPolicy, Level[]>): void {
  mkdirSync(OUT, { recursive: true });
  const file = join(OUT, `routing-${name}.svg`);
  writeFileSync(
    file,
    loadFigure(
      [...runs].map(([policy, levels]) => ({ name: policy, levels: levels.map((l) => l.summary) })),
      { title: `${name}: ${ENGINES} sim H100 engines, simulated` },
    ),
  );
  process.stdout.write(`plot: ${file}\n`);
}

function verdict(what: string, value: number, target: string, ok: boolean): void {
  process.stdout.write(`  ${ok ? "met" : "MISSED"}  ${what}: ${value.toFixed(2)} (target ${target})\n`);
}

function simulation(): void {
  process.stdout.write(
    `# Routing simulation: ${ENGINES} engines, ${WARMUP_S} s warm-up + ${MEASURE_S} s measured per level, seed ${SEED}\n`,
  );
  const sharedRates = QUICK ? [16, 32, 48, 64] : [16, 24, 28, 32, 40, 48, 56, 64, 72];
  const shared = sweep(SHARED, sharedRates);
  const sk = report(`shared prefix: ${SHARED.describe()}`, shared);
  plot("shared-prefix", shared);
  const rrKnee = sk.get("round-robin");
  const chatKnee = sk.get("chat");
  process.stdout.write("\ntargets, shared prefix:\n");
  if (rrKnee && chatKnee) {
    const ratio = chatKnee.summary.outputTokensPerSecond / rrKnee.summary.outputTokensPerSecond;
    verdict("throughput at the knee, chat ÷ round-robin", ratio, "≥ 2", ratio >= 2);
    const at = Math.round(rrKnee.spec.rate * 0.8 * 10) / 10;
    const rr = level(SHARED, "round-robin", at);
    const chat = level(SHARED, "chat", at);
    process.stdout.write(
      `  at 80 % of round-robin's knee (${at} req/s): TTFT p90 round-robin ${ms(rr.summary.ttft.p90)}, chat ${ms(chat.summary.ttft.p90)}\n`,
    );
    const t = (rr.summary.ttft.p90 ?? 0) / (chat.summary.ttft.p90 ?? Number.POSITIVE_INFINITY);
    verdict("TTFT p90 at 80 % of round-robin's knee, round-robin ÷ chat", t, "≥ 5", t >= 5);
  } else process.stdout.write("  a knee is missing from the sweep: widen the rates\n");

  const randomRates = QUICK ? [80, 160, 200] : [80, 120, 160, 180, 200, 240];
  const low = sweep(RANDOM, randomRates);
  const lk = report(`low sharing: ${RANDOM.describe()}`, low);
  plot("random", low);
  const rrLow = lk.get("round-robin");
  const chatLow = lk.get("chat");
  process.stdout.write("\ntargets, low sharing:\n");
  if (rrLow && chatLow) {
    const ratio = chatLow.summary.outputTokensPerSecond / rrLow.summary.outputTokensPerSecond;
    verdict("throughput at the knee, chat ÷ round-robin", ratio, "≥ 0.97", ratio >= 0.97);
  } else process.stdout.write("  a knee is missing from the sweep: widen the rates\n");

  if (!chatLow) return;
  const mix = bandMix({
    base: "random",
    bands: DEFAULT_BANDS,
    promptTokens: 1000,
    spread: 0.5,
    outputTokens: 200,
    ignoreEos: true,
  });
  const unloaded = level(mix, "chat", Math.round(chatLow.spec.rate * 0.1));
  const overload = level(mix, "chat", Math.round(chatLow.spec.rate * 1.6));
  process.stdout.write(`\n## band mix (${mix.describe()}), chat\n\n`);
  const bandRows: string[][] = [];
  for (const [name, l] of [
    ["unloaded", unloaded],
    ["overloaded", overload],
  ] as const) {
    for (const [band, b] of Object.entries(l.summary.bands ?? {}) as [string, LevelSummary][]) {
      bandRows.push([
        name,
        String(l.spec.rate),
        band,
        String(b.requests),
        pct(b.successRate),
        Object.entries(b.errors)
          .map(([k, v]) => `${k} ×${v}`)
          .join(", ") || "-",
        ms(b.ttft.p50),
        ms(b.ttft.p99),
      ]);
    }
  }
  process.stdout.write(
    `${renderTable(["load", "req/s", "band", "requests", "served", "refused", "TTFT p50", "TTFT p99"], bandRows)}\n`,
  );
  const p0 = unloaded.summary.bands?.platinum?.ttft.p99 ?? null;
  const p1 = overload.summary.bands?.platinum?.ttft.p99 ?? null;
  process.stdout.write("\ntargets, band mix:\n");
  if (p0 !== null && p1 !== null)
    verdict("platinum TTFT p99, overloaded ÷ unloaded", p1 / p0, "≤ 2", p1 / p0 <= 2);
}

/**
 * What the fleet serves flat out, req/s: platinum alone (ceiling 1.0) far
 * above any knee, counted over the measured window.
 */
function servedRate(core: typeof DEFAULT_H100_8B_CORE, rate: number): number {
  const l = runLevel({
    workload: RANDOM,
    policy: "chat",
    rate,
    engines: ENGINES,
    core,
    settings: routerSchema.parse({ admission: { default_band: "platinum" } }),
    warmupS: 20,
    measureS: 40,
    seed: SEED,
  });
  return l.summary.outputTokensPerSecond / 200;
}

function burst(): void {
  process.stdout.write(
    "\n## burst: bronze steps from idle to 3× what the fleet serves, platinum 2 req/s from 2 s on, 30 s, load fed with its real lag\n\n",
  );
  const fleets = [
    { name: "H100 8B, batch 256", core: DEFAULT_H100_8B_CORE },
    { name: "H100 8B, --max-num-seqs 16", core: { ...DEFAULT_H100_8B_CORE, maxNumSeqs: 16 } },
  ];
  const rows: string[][] = [];
  const checks: [string, number][] = [];
  for (const f of fleets) {
    const capacity = servedRate(f.core, 400);
    // The last row only differs from the one before where a batch is under
    // seq_floor: it counts half of it, as before the floor.
    const designs = [
      { design: "in-flight target", label: "in-flight target", settings },
      { design: "capacity + demand", label: "capacity + demand", settings },
      { design: "+ first tokens", label: "+ first tokens", settings },
      {
        design: "+ first tokens",
        label: "+ first tokens, half the batch (seq_floor 0)",
        settings: routerSchema.parse({ scoring: { seq_floor: 0 } }),
      },
    ] as const;
    for (const { design, label, settings } of designs) {
      const r = runBurst({
        workload: RANDOM,
        engines: ENGINES,
        core: f.core,
        settings,
        bronzeRate: Math.round(3 * capacity),
        platinumRate: 2,
        platinumFromS: 2,
        burstS: 30,
        seed: SEED,
        design,
      });
      const ratio = r.platinum.p99 / r.platinum.unloadedP99;
      if (label === "+ first tokens") checks.push([f.name, ratio]);
      rows.push([
        f.name,
        label,
        `${Math.round(capacity)} → ${Math.round(3 * capacity)}`,
        r.ceilingAfterMs === null ? "never" : `${Math.round(r.ceilingAfterMs)} ms`,
        ms(r.platinum.p50 / 1000),
        ms(r.platinum.p99 / 1000),
        `${ratio.toFixed(2)}×`,
        `${r.platinum.served}/${r.platinum.requests}`,
        `${r.bronze.served}/${r.bronze.requests}`,
        String(r.bronze.full),
        String(r.bronze.expired),
      ]);
    }
  }
  process.stdout.write(
    `${renderTable(
      [
        "fleet",
        "admission",
        "served → bronze req/s",
        "bronze held after",
        "plat TTFT p50",
        "plat TTFT p99",
        "÷ unloaded",
        "plat served",
        "bronze served",
        "429",
        "503",
      ],
      rows,
    )}\n\ntargets, burst:\n`,
  );
  for (const [name, ratio] of checks)
    verdict(`${name}: platinum TTFT p99 under the burst ÷ unloaded`, ratio, "≤ 1.5", ratio <= 1.5);
}

if (PARTS.has("sim")) simulation();
if (PARTS.has("burst")) burst();
if (PARTS.has("pick")) pickBenchmark();
if (PARTS.has("rtt")) await poolRoundTrip();
if (PARTS.has("isolates")) await poolIsolates();
if (PARTS.has("real")) await realConfirmation({ quick: QUICK });
if (PARTS.has("real-burst")) await realBurst();
