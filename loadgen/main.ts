/**
 * `llmgw bench`: sweeps load levels against an OpenAI-compatible URL and
 * prints one row per level (docs/bench.md). Exit codes: 0 done, 1 the
 * target could not be used (unreachable, key refused, nothing succeeded),
 * 2 bad flags.
 */
import { writeFileSync } from "node:fs";
import { errorMessage } from "../common/log.ts";
import { Client, closedLoop, type LoopResult, openLoop } from "./client.ts";
import { BENCH_HELP, type BenchFlags, FlagError, parseBenchFlags, type WorkloadSpec } from "./flags.ts";
import { loadFigure } from "./plot.ts";
import {
  ENDPOINT_HEADER,
  formatTable,
  LevelStats,
  type LevelSummary,
  type Load,
  loadLabel,
  ms,
  ROUTE_HEADER,
  sortBands,
} from "./stats.ts";
import { bandMix, randomPrompts, sharedPrefix, type Workload } from "./workloads.ts";

export function workloadOf(spec: WorkloadSpec): Workload {
  switch (spec.kind) {
    case "shared-prefix":
      return sharedPrefix(spec.options);
    case "random":
      return randomPrompts(spec.options);
    case "band-mix":
      return spec.base === "shared-prefix"
        ? bandMix({ base: "shared-prefix", bands: spec.bands, ...spec.options })
        : bandMix({ base: "random", bands: spec.bands, ...spec.options });
  }
}

/** Picks the model and proves the URL answers before a sweep is spent on connection errors. */
async function resolveModel(client: Client, f: BenchFlags): Promise<string> {
  let listed: Awaited<ReturnType<Client["models"]>>;
  try {
    listed = await client.models();
  } catch (err) {
    throw new Error(`cannot reach ${f.url}: ${errorMessage(err)}`);
  }
  if (listed.status === 401 || listed.status === 403) {
    const key = f.apiKey ? "refused the API key" : "wants an API key (set $LLMGW_API_KEY)";
    throw new Error(`${f.url} ${key}: ${listed.status} ${listed.error ?? ""}`.trimEnd());
  }
  if (f.model !== undefined) {
    if (listed.status === 200 && !listed.models.includes(f.model)) {
      process.stderr.write(
        `llmgw bench: warning: ${f.url}/v1/models does not list "${f.model}" (it lists ${listed.models.join(", ") || "nothing"})\n`,
      );
    }
    return f.model;
  }
  if (listed.status !== 200) {
    throw new Error(`GET ${f.url}/v1/models: ${listed.status} ${listed.error ?? ""}; pass --model`.trim());
  }
  const first = listed.models[0];
  if (first === undefined) throw new Error(`${f.url}/v1/models lists no model; pass --model`);
  return first;
}

interface LevelResult {
  summary: LevelSummary;
  loop: LoopResult;
}

async function runLevel(
  client: Client,
  workload: Workload,
  f: BenchFlags,
  load: Load,
  start: number,
  stop: { seconds?: number; count?: number },
): Promise<LevelResult> {
  const stats = new LevelStats(load);
  const requests = workload.iterate({
    seed: f.seed,
    start,
    ...(load.kind === "rate" ? { rate: load.value } : {}),
  });
  const onResult = stats.add.bind(stats);
  const loop =
    load.kind === "rate"
      ? await openLoop(client, requests, stop, onResult)
      : await closedLoop(client, requests, load.value, stop, onResult);
  return { summary: stats.summary(loop.seconds), loop };
}

export async function main(argv: string[]): Promise<number> {
  let f: BenchFlags;
  try {
    const parsed = parseBenchFlags(argv, process.env);
    if (parsed === "help") {
      process.stdout.write(BENCH_HELP);
      return 0;
    }
    f = parsed;
  } catch (err) {
    if (!(err instanceof FlagError)) throw err;
    process.stderr.write(`llmgw bench: ${err.message}\n(llmgw bench --help lists the flags)\n`);
    return 2;
  }
  const client = new Client({
    url: f.url,
    model: "",
    ...(f.apiKey ? { apiKey: f.apiKey } : {}),
    headers: f.headers,
    timeoutMs: f.timeoutMs,
    timeScale: f.timeScale,
    record: [ENDPOINT_HEADER, ROUTE_HEADER],
  });
  try {
    let model: string;
    try {
      model = await resolveModel(client, f);
    } catch (err) {
      process.stderr.write(`llmgw bench: ${errorMessage(err)}\n`);
      return 1;
    }
    client.target.model = model;
    const workload = workloadOf(f.workload);
    const per =
      "seconds" in f.level ? `${f.level.seconds} s per level` : `${f.level.requests} requests per level`;
    const scale = f.timeScale === 1 ? "" : `, time scale ${f.timeScale}× (times in the target's time)`;
    const heading = `llmgw bench: ${f.url} model ${model}; ${workload.describe()}; seed ${f.seed}; ${per}${scale}`;
    process.stderr.write(`${heading}\n`);

    const loads: Load[] = f.load.values.map((value) => ({ kind: f.load.kind, value }));
    const stop = "seconds" in f.level ? { seconds: f.level.seconds } : { count: f.level.requests };
    let position = 0;
    let warmup: LevelSummary | undefined;
    if (f.warmup > 0) {
      const warm = await runLevel(client, workload, f, loads[0]!, 0, { count: f.warmup });
      position += warm.loop.sent;
      warmup = warm.summary;
      process.stderr.write(
        `warmup: ${warm.summary.requests} requests at ${loadLabel(loads[0]!)}, ${(warm.summary.successRate * 100).toFixed(1)} % ok\n`,
      );
    }
    const levels: LevelResult[] = [];
    for (const [i, load] of loads.entries()) {
      const level = await runLevel(client, workload, f, load, position, stop);
      position += level.loop.sent;
      levels.push(level);
      const s = level.summary;
      const late = level.loop.late;
      process.stderr.write(
        `level ${i + 1}/${loads.length} (${loadLabel(load)}): ${s.requests} sent, ${(s.successRate * 100).toFixed(1)} % ok, ${s.seconds.toFixed(1)} s` +
          (s.firstError !== undefined ? `; first error: ${s.firstError}` : "") +
          "\n",
      );
      // An open loop that cannot keep its schedule measures the client, not the target.
      if (late && load.kind === "rate" && late.p99 > 1 / load.value) {
        process.stderr.write(
          `  warning: requests left up to ${ms(late.p99)} ms late (p99), more than the mean gap between arrivals: this client (or its machine) did not keep the schedule, so the level offered less than its rate\n`,
        );
      }
    }

    const summaries = levels.map((l) => l.summary);
    if (f.plot !== undefined) {
      const title = `${f.url}, model ${model}\n${workload.describe()}; seed ${f.seed}; ${per}${scale}`;
      // A band mix plots each band beside the whole: what admission does to each class is the point.
      const bands = sortBands(summaries.flatMap((l) => Object.keys(l.bands ?? {}))).map((band) => ({
        name: band,
        levels: summaries.flatMap((l) => l.bands?.[band] ?? []),
      }));
      const all = { name: bands.length > 0 ? "all bands" : `${workload.name} → ${f.url}`, levels: summaries };
      writeFileSync(f.plot, loadFigure([all, ...bands], { title }));
      process.stderr.write(`plot written to ${f.plot}\n`);
    }
    if (f.json) {
      const out = {
        url: f.url,
        model,
        workload: workload.name,
        description: workload.describe(),
        seed: f.seed,
        timeScale: f.timeScale,
        ...(warmup ? { warmup } : {}),
        levels: levels.map((l) => ({ ...l.summary, ...(l.loop.late ? { late: l.loop.late } : {}) })),
      };
      process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
    } else {
      process.stdout.write(`${heading}\n\n${formatTable(summaries)}`);
    }
    if (summaries.every((s) => s.completed === 0)) {
      const why = summaries.find((s) => s.firstError !== undefined)?.firstError ?? "no requests were sent";
      process.stderr.write(`llmgw bench: no request succeeded: ${why}\n`);
      return 1;
    }
    return 0;
  } finally {
    client.close();
  }
}
