/**
 * `llmgw bench`: sweeps load levels against an OpenAI-compatible URL and
 * prints one row per level (docs/bench.md). Exit codes: 0 done, 1 the
 * target could not be used (unreachable, key refused, nothing succeeded),
 * 2 bad flags.
 */
import { accessSync, constants, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { errorMessage } from "../common/log.ts";
import { Client, closedLoop, type LoopResult, type LoopStop, openLoop } from "./client.ts";
import { BENCH_HELP, type BenchFlags, FlagError, parseBenchFlags, type WorkloadSpec } from "./flags.ts";
import { loadFigure } from "./plot.ts";
import {
  ADMITTED_HEADER,
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
  seed: number,
  load: Load,
  start: number,
  stop: LoopStop,
): Promise<LevelResult> {
  const stats = new LevelStats(load);
  const requests = workload.iterate({ seed, start, ...(load.kind === "rate" ? { rate: load.value } : {}) });
  const onResult = stats.add.bind(stats);
  const loop =
    load.kind === "rate"
      ? await openLoop(client, requests, stop, onResult)
      : await closedLoop(client, requests, load.value, stop, onResult);
  return { summary: stats.summary(loop.seconds), loop };
}

const percent = (s: LevelSummary) => `${(s.successRate * 100).toFixed(1)} % ok`;

class WarmupFailed extends Error {}

/** The warmup, then each level in turn, one request sequence throughout; progress on stderr. */
async function sweep(
  client: Client,
  workload: Workload,
  f: BenchFlags,
): Promise<{ warmup?: LevelSummary; levels: LevelResult[] }> {
  const loads: Load[] = f.load.values.map((value) => ({ kind: f.load.kind, value }));
  const stop: LoopStop = "seconds" in f.level ? { seconds: f.level.seconds } : { count: f.level.requests };
  let position = 0;
  let warmup: LevelSummary | undefined;
  if (f.warmup > 0) {
    const warm = await runLevel(client, workload, f.seed, loads[0]!, 0, { count: f.warmup });
    position += warm.loop.sent;
    warmup = warm.summary;
    process.stderr.write(
      `warmup: ${warmup.requests} requests at ${loadLabel(loads[0]!)}, ${percent(warmup)}\n`,
    );
    // Every level would fail the same way: say why now instead of after the sweep.
    if (warmup.completed === 0)
      throw new WarmupFailed(`no warmup request succeeded: ${warmup.firstError ?? "none was sent"}`);
  }
  const levels: LevelResult[] = [];
  for (const [i, load] of loads.entries()) {
    const level = await runLevel(client, workload, f.seed, load, position, stop);
    position += level.loop.sent;
    levels.push(level);
    const s = level.summary;
    process.stderr.write(
      `level ${i + 1}/${loads.length} (${loadLabel(load)}): ${s.requests} sent, ${percent(s)}, ${s.seconds.toFixed(1)} s` +
        (s.firstError !== undefined ? `; first error: ${s.firstError}` : "") +
        "\n",
    );
    // An open loop that cannot keep its schedule measures the client, not the target.
    const late = level.loop.late;
    if (late && load.kind === "rate" && late.p99 > 1 / load.value) {
      process.stderr.write(
        `  warning: requests left up to ${ms(late.p99)} ms late (p99), more than the mean gap between arrivals: this client (or its machine) did not keep the schedule, so the level offered less than its rate\n`,
      );
    }
  }
  return { ...(warmup ? { warmup } : {}), levels };
}

/** A band mix plots each band beside the whole: what admission does to each class is the point. */
function figure(summaries: LevelSummary[], name: string, title: string): string {
  const bands = sortBands(summaries.flatMap((l) => Object.keys(l.bands ?? {}))).map((band) => ({
    name: band,
    levels: summaries.flatMap((l) => l.bands?.[band] ?? []),
  }));
  return loadFigure([{ name: bands.length > 0 ? "all bands" : name, levels: summaries }, ...bands], {
    title,
  });
}

/** A plot path whose directory is missing fails now, not after the sweep. */
function checkPlotPath(path: string): void {
  try {
    accessSync(dirname(resolve(path)), constants.W_OK);
  } catch {
    throw new FlagError(`--plot: cannot write in ${dirname(resolve(path))}`);
  }
}

function parse(argv: string[]): BenchFlags | "help" {
  const f = parseBenchFlags(argv, process.env);
  if (f !== "help" && f.plot !== undefined) checkPlotPath(f.plot);
  return f;
}

export async function main(argv: string[]): Promise<number> {
  let f: BenchFlags;
  try {
    const parsed = parse(argv);
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
    record: [ENDPOINT_HEADER, ROUTE_HEADER, ADMITTED_HEADER],
  });
  try {
    try {
      client.target.model = await resolveModel(client, f);
    } catch (err) {
      process.stderr.write(`llmgw bench: ${errorMessage(err)}\n`);
      return 1;
    }
    const model = client.target.model;
    const workload = workloadOf(f.workload);
    const per =
      "seconds" in f.level ? `${f.level.seconds} s per level` : `${f.level.requests} requests per level`;
    const scale = f.timeScale === 1 ? "" : `, time scale ${f.timeScale}× (times in the target's time)`;
    const setup = `${workload.describe()}; seed ${f.seed}; ${per}${scale}`;
    const heading = `llmgw bench: ${f.url} model ${model}; ${setup}`;
    process.stderr.write(`${heading}\n`);

    let swept: Awaited<ReturnType<typeof sweep>>;
    try {
      swept = await sweep(client, workload, f);
    } catch (err) {
      if (!(err instanceof WarmupFailed)) throw err;
      process.stderr.write(`llmgw bench: ${err.message}; no level was run\n`);
      return 1;
    }
    const { warmup, levels } = swept;
    const summaries = levels.map((l) => l.summary);
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
    if (f.plot !== undefined) {
      const title = `${f.url}, model ${model}\n${setup}`;
      writeFileSync(f.plot, figure(summaries, `${workload.name} → ${f.url}`, title));
      process.stderr.write(`plot written to ${f.plot}\n`);
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
