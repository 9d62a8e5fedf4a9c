/**
 * `npm run bench:sites`: two sites of 4 simulated engines each behind one
 * pool (the real PoolCore, bench/routing/sites-sim.ts); half the requests
 * come from "EU", whose nearest site is A, half from "NA" (site B). Site A
 * is lost whole (`kill -9` of its engines and control plane) at 60 s under
 * load and comes back at 120 s; in the last design it is partitioned
 * instead (packets dropped: each attempt there fails when its timeout runs
 * out). Printed, per design and load:
 *
 * - failed requests: refused by admission (the survivor alone is short of
 *   capacity at 70 %: 140 % of one site), or every attempt failed before
 *   the first byte; and apart, streams cut mid-answer when their engine died;
 * - TTFT p99 before the loss, in the 10 s around it (±5 s), and in the 10 s
 *   after the return;
 * - how long after the loss until no request goes to site A any more;
 * - how long after the return until A has its preferred share of EU's
 *   requests back (within 5 % of what it had before the loss, over 5 s).
 *
 * Env: SEED, QUICK=1 (one load).
 */

import { renderTable } from "../common/text-table.ts";
import { type RouterConfig, routerSchema } from "../edge/config/router.ts";
import { percentile } from "../loadgen/stats.ts";
import { bandMix, randomPrompts } from "../loadgen/workloads.ts";
import { DEFAULT_H100_8B_CORE } from "../sim-engine/engine-core.ts";
import { numberKnob } from "./knobs.ts";
import { requestsFor, runLevel } from "./routing/levels.ts";
import { type LocatedRequest, type SiteRequestResult, simulateSites } from "./routing/sites-sim.ts";

const SEED = numberKnob("SEED", 1);
const QUICK = process.env.QUICK === "1";
const ENGINES_PER_SITE = 4;
const LOSS_AT = 60_000;
const RETURN_AT = 120_000;
const END_S = 180;
const WINDOW = 5_000;
const BASE = { promptTokens: 1000, spread: 0.5, outputTokens: 200, ignoreEos: true } as const;

/** Platinum and gold only: bronze and silver queue by design at 70 % of the fleet even with both sites up. */
const BANDS = { platinum: 0.2, gold: 0.8 };
const PREFERENCE = { continents: { EU: ["a", "b"], NA: ["b", "a"] } };
const DESIGNS: { name: string; settings: RouterConfig; loss?: "partition" }[] = [
  {
    name: "preference + warm-up 30s",
    settings: routerSchema.parse({ sites: { ...PREFERENCE, warmup: "30s" } }),
  },
  {
    name: "preference, no warm-up",
    settings: routerSchema.parse({ sites: { ...PREFERENCE, warmup: "0s" } }),
  },
  { name: "no preference (load only)", settings: routerSchema.parse({ sites: { warmup: "0s" } }) },
  {
    name: "preference + warm-up 30s, A partitioned",
    settings: routerSchema.parse({ sites: { ...PREFERENCE, warmup: "30s" } }),
    loss: "partition",
  },
];

/** Requests per second the whole fleet (both sites) serves flat out: platinum alone, far past any knee. */
function fleetCapacity(): number {
  const l = runLevel({
    workload: randomPrompts(BASE),
    policy: "chat",
    rate: 400,
    engines: 2 * ENGINES_PER_SITE,
    core: DEFAULT_H100_8B_CORE,
    settings: routerSchema.parse({ admission: { default_band: "platinum" } }),
    warmupS: 20,
    measureS: 40,
    seed: SEED,
  });
  return l.summary.outputTokensPerSecond / BASE.outputTokens;
}

function arrivals(rate: number): LocatedRequest[] {
  const workload = bandMix({ base: "random", bands: BANDS, ...BASE });
  return requestsFor(workload, rate, END_S, SEED).map((r, i) => ({
    ...r,
    location: { continent: i % 2 === 0 ? "EU" : "NA" },
  }));
}

const p99 = (rs: readonly SiteRequestResult[]) => {
  const t = rs
    .filter((r) => r.firstToken !== undefined)
    .map((r) => r.firstToken! - r.arrival)
    .sort((a, b) => a - b);
  return percentile(t, 99);
};

const arrivedIn = (rs: readonly SiteRequestResult[], from: number, to: number) =>
  rs.filter((r) => r.arrival >= from && r.arrival < to);

/** EU's requests whose first attempt went to site A, over [from, to). */
function euShareOnA(rs: readonly SiteRequestResult[], from: number, to: number): number | null {
  let eu = 0;
  let a = 0;
  for (const r of rs) {
    const first = r.attempts[0];
    if (r.location.continent !== "EU" || !first || first.at < from || first.at >= to) continue;
    eu++;
    if (first.site === "a") a++;
  }
  return eu > 0 ? a / eu : null;
}

/** The first 5 s window after the return in which A has EU's pre-loss share back (within 5 %), as time from the return. */
function splitBackAfter(rs: readonly SiteRequestResult[]): number | null {
  const before = euShareOnA(rs, LOSS_AT - 30_000, LOSS_AT) ?? 0;
  for (let t = RETURN_AT; t + WINDOW <= END_S * 1000; t += 500) {
    const share = euShareOnA(rs, t, t + WINDOW);
    if (share !== null && share >= before - 0.05) return t + WINDOW - RETURN_AT;
  }
  return null;
}

/** From the loss to the last attempt that went to A before its return. */
function offAAfter(rs: readonly SiteRequestResult[]): number {
  let last = LOSS_AT;
  for (const r of rs)
    for (const a of r.attempts)
      if (a.site === "a" && a.at >= LOSS_AT && a.at < RETURN_AT) last = Math.max(last, a.at);
  return last - LOSS_AT;
}

const ms = (v: number | null) => (v === null ? "-" : `${Math.round(v).toLocaleString("en-US")} ms`);
const s = (v: number | null) =>
  v === null ? "never" : v < 1_000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(1)} s`;

function failures(rs: readonly SiteRequestResult[]): string {
  const byBand = new Map<string, number>();
  for (const r of rs) if (r.status !== 200) byBand.set(r.band, (byBand.get(r.band) ?? 0) + 1);
  const total = [...byBand.values()].reduce((a, b) => a + b, 0);
  if (total === 0) return "0";
  return `${total} (${[...byBand].map(([b, n]) => `${b} ${n}`).join(", ")})`;
}

function main(): void {
  const capacity = fleetCapacity();
  process.stdout.write(
    `\n## sites: two sites of ${ENGINES_PER_SITE} engines (H100 8B sim), site A lost at ${LOSS_AT / 1000} s and back at ${RETURN_AT / 1000} s\n\n` +
      `fleet capacity (both sites, flat out): ${capacity.toFixed(1)} req/s; random 1,000 ± 50 % token prompts, 200 out, bands ${Object.entries(
        BANDS,
      )
        .map(([b, w]) => `${b} ${w * 100} %`)
        .join(", ")}; half EU (nearest A), half NA (nearest B)\n\n`,
  );
  const rows: string[][] = [];
  for (const load of QUICK ? [0.7] : [0.7, 0.45]) {
    const reqs = arrivals(load * capacity);
    for (const d of DESIGNS) {
      const rs = simulateSites(
        {
          sites: ["a", "b"],
          enginesPerSite: ENGINES_PER_SITE,
          core: DEFAULT_H100_8B_CORE,
          settings: d.settings,
          lossAt: LOSS_AT,
          returnAt: RETURN_AT,
          seed: SEED,
          ...(d.loss ? { loss: d.loss } : {}),
        },
        reqs,
      );
      rows.push([
        `${Math.round(load * 100)} %`,
        d.name,
        String(rs.length),
        failures(rs),
        String(rs.filter((r) => r.cut).length),
        String(rs.filter((r) => r.status === 200 && r.attempts.length > 1).length),
        ms(p99(arrivedIn(rs, LOSS_AT - 30_000, LOSS_AT))),
        ms(p99(arrivedIn(rs, LOSS_AT - 5_000, LOSS_AT + 5_000))),
        s(offAAfter(rs)),
        s(splitBackAfter(rs)),
        ms(p99(arrivedIn(rs, RETURN_AT, RETURN_AT + 10_000))),
      ]);
    }
  }
  process.stdout.write(
    `${renderTable(
      [
        "load",
        "design",
        "requests",
        "failed",
        "cut mid-stream",
        "retried, served",
        "TTFT p99 before",
        "TTFT p99 ±5 s of loss",
        "all on B after",
        "split back after",
        "TTFT p99 10 s after return",
      ],
      rows,
    )}\n`,
  );
}

main();
