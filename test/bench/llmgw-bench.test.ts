import { existsSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LevelSummary, sortBands } from "../../loadgen/stats.ts";
import { FaultPlan } from "../../sim-engine/faults.ts";
import {
  createKey,
  type Edge,
  engineCounters,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "../edge/helpers.ts";
import { freePort, runLlmgw } from "../harness/process.ts";

interface BenchJson {
  url: string;
  model: string;
  workload: string;
  timeScale: number;
  warmup?: LevelSummary;
  levels: LevelSummary[];
}

const SPEED = "200";
const FAULT_SEED = 7;
const FAIL_RATE = 0.25;
const HANG_AFTER = 5;

/**
 * `llmgw bench` as a real process against real sim engines, directly and
 * through the edge in workerd; its figures are checked against the
 * engines' own counters.
 */
describe("llmgw bench", () => {
  let simA: Sim;
  let simB: Sim;
  let faulty: Sim;
  let failing: Sim;
  let edge: Edge;
  let key: TestKey;
  const plot = join(tmpdir(), `llmgw-bench-${process.pid}.svg`);
  const bandPlot = join(tmpdir(), `llmgw-bench-bands-${process.pid}.svg`);

  beforeAll(async () => {
    [simA, simB, faulty, failing, edge] = await Promise.all([
      startSim("bench"),
      startSim("bench"),
      startSim("bench", [
        "--seed",
        String(FAULT_SEED),
        "--sim-fail-rate",
        String(FAIL_RATE),
        "--sim-hang-after",
        String(HANG_AFTER),
        "--sim-hang-phase",
        "mid-stream",
      ]),
      startSim("bench", ["--sim-fail-rate", "1"]),
      startEdge(),
    ]);
    await setEndpoints(edge, [
      { id: "bench-a", url: simA.url, models: ["bench"] },
      { id: "bench-b", url: simB.url, models: ["bench"] },
    ]);
    key = await createKey(edge, { band: "platinum" });
  }, 90_000);

  afterAll(async () => {
    rmSync(plot, { force: true });
    rmSync(bandPlot, { force: true });
    await stopStarted();
  });

  it("sweeps concurrency against an engine directly; its token counts are the engine's", async () => {
    const [a0, b0] = await Promise.all([engineCounters(simA), engineCounters(simB)]);
    const run = await runLlmgw([
      "bench",
      "--url",
      `${simA.url}/v1`,
      "--concurrency",
      "1,4",
      "--requests",
      "8",
      "--warmup",
      "3",
      "--groups",
      "2",
      "--users-per-group",
      "2",
      "--system-tokens",
      "300",
      "--question-tokens",
      "40",
      "--output-tokens",
      "16",
      "--ignore-eos",
      "--time-scale",
      SPEED,
      "--json",
      "--plot",
      plot,
    ]);
    expect(run.code, run.stderr).toBe(0);
    const out = JSON.parse(run.stdout) as BenchJson;
    expect(out).toMatchObject({ url: simA.url, model: "bench", workload: "shared-prefix", timeScale: 200 });
    expect(out.levels.map((l) => l.load)).toEqual([
      { kind: "concurrency", value: 1 },
      { kind: "concurrency", value: 4 },
    ]);
    for (const l of out.levels) {
      expect(l).toMatchObject({
        requests: 8,
        completed: 8,
        successRate: 1,
        errors: {},
        outputTokens: 8 * 16,
      });
      expect(l.ttft.p50).toBeGreaterThan(0);
      expect(l.ttft.p90!).toBeGreaterThanOrEqual(l.ttft.p50!);
      expect(l.ttft.p99!).toBeGreaterThanOrEqual(l.ttft.p90!);
      expect(l.e2e.p50!).toBeGreaterThan(l.ttft.p50!);
      expect(l.itl.p90!).toBeGreaterThanOrEqual(l.itl.p50!);
      expect(l.itl.p50!).toBeGreaterThan(0);
      expect(l.achievedRps).toBeGreaterThan(0);
      expect(l.outputTokensPerSecond).toBeCloseTo((8 * 16) / l.seconds, 6);
      // A bare engine sends no routing headers.
      expect(l.endpoints).toBeUndefined();
    }
    const [a1, b1] = await Promise.all([engineCounters(simA), engineCounters(simB)]);
    const measured = [out.warmup!, ...out.levels];
    expect(out.warmup!.requests).toBe(3);
    expect(a1.generation - a0.generation).toBe(measured.reduce((s, l) => s + l.outputTokens, 0));
    expect(a1.prompt - a0.prompt).toBe(measured.reduce((s, l) => s + l.promptTokens, 0));
    expect(a1.finished - a0.finished).toBe(3 + 16);
    expect(b1).toEqual(b0);
    // Progress and the heading go to stderr, so stdout is only the JSON.
    expect(run.stderr).toMatch(/level 2\/2 \(4 conc\): 8 sent, 100\.0 % ok/);
    expect(existsSync(plot)).toBe(true);
    const svg = readFileSync(plot, "utf8");
    expect(svg).toMatch(/^<\?xml[\s\S]*<svg [\s\S]*<\/svg>\n$/);
    expect(svg).toContain(`data-name="shared-prefix → ${simA.url}"`);
  });

  it("through the edge: a band mix over two engines; the endpoint spread matches what each engine served, sessions are kept", async () => {
    const [a0, b0] = await Promise.all([engineCounters(simA), engineCounters(simB)]);
    const run = await runLlmgw(
      [
        "bench",
        "--url",
        edge.url,
        "--model",
        "bench",
        "--workload",
        "band-mix",
        "--band-base",
        "shared-prefix",
        "--groups",
        "2",
        "--users-per-group",
        "2",
        "--system-tokens",
        "200",
        "--question-tokens",
        "20",
        "--output-tokens",
        "8",
        "--rate",
        "20",
        "--requests",
        "12",
        "--json",
        "--plot",
        bandPlot,
      ],
      { LLMGW_API_KEY: key.secret, OPENAI_API_KEY: "" },
    );
    expect(run.code, run.stderr).toBe(0);
    const [level] = (JSON.parse(run.stdout) as BenchJson).levels;
    expect(level).toMatchObject({
      load: { kind: "rate", value: 20 },
      requests: 12,
      completed: 12,
      errors: {},
    });
    const [a1, b1] = await Promise.all([engineCounters(simA), engineCounters(simB)]);
    const counts = level!.endpoints!.counts;
    expect(counts["bench-a"] ?? 0).toBe(a1.finished - a0.finished);
    expect(counts["bench-b"] ?? 0).toBe(b1.finished - b0.finished);
    const served = Object.values(counts);
    expect(level!.endpoints!.maxOverMean).toBeCloseTo(Math.max(...served) / (12 / served.length), 9);
    expect(a1.generation - a0.generation + (b1.generation - b0.generation)).toBe(level!.outputTokens);
    // Each conversation's requests carry its x-session-id; the pool keeps a known session where it was.
    const routes = level!.routes!;
    expect(Object.values(routes).reduce((s, n) => s + n, 0)).toBe(12);
    expect(routes.session).toBeGreaterThan(0);
    // A session's turn always asks the pool, which holds its pin: none came from a grant.
    expect(level!.admitted).toEqual({ pool: 12 });
    // Per requested band: every request under one of the mix's bands.
    const bands = level!.bands!;
    expect(Object.keys(bands).every((b) => ["platinum", "gold", "silver", "bronze"].includes(b))).toBe(true);
    expect(Object.values(bands).reduce((s, b) => s + b.completed, 0)).toBe(12);
    // The plot has the whole and each band, in priority order, in both panels.
    const names = [...readFileSync(bandPlot, "utf8").matchAll(/class="series" data-name="([^"]+)"/g)].map(
      (m) => m[1],
    );
    const series = ["all bands", ...sortBands(Object.keys(bands))];
    expect(names).toEqual([...series, ...series]);
  });

  it("prints the table: one row per level, the endpoint, route and admitted columns when the edge sends those headers", async () => {
    const run = await runLlmgw(
      [
        "bench",
        "--url",
        edge.url,
        "--workload",
        "random",
        "--prompt-tokens",
        "30",
        "--output-tokens",
        "4",
      ].concat(["--concurrency", "1,2", "--requests", "4"]),
      { LLMGW_API_KEY: key.secret },
    );
    expect(run.code, run.stderr).toBe(0);
    const lines = run.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(new RegExp(`^llmgw bench: ${edge.url} model bench; random: 30 ± 20 %-token`));
    expect(lines[2]).toMatch(
      /^load\s+sent\s+ok %\s+req\/s\s+out tok\/s\s+TTFT p50 ms\s.*endpoints max\/mean\s+routes\s+admitted\s+errors$/,
    );
    expect(lines[3]).toMatch(/^1 conc\s+4\s+100\.0\s/);
    // The spread over 1 or 2 endpoints, then the routes that decided (x-llmgw-route) and how
    // the edge let each in (x-llmgw-admitted), 4 in all in each.
    const row =
      /^2 conc\s+4\s+100\.0\s.*\s\d\.\d\d \([12]\)\s+((?:[a-z-]+:\d+ ?)+?)\s{2,}((?:(?:pool|grant):\d+ ?)+)\s+-$/.exec(
        lines[4]!,
      );
    expect(row, lines[4]).not.toBeNull();
    const sum = (cell: string) =>
      cell
        .trim()
        .split(" ")
        .reduce((s, kv) => s + Number(kv.split(":")[1]), 0);
    expect(sum(row![1]!)).toBe(4);
    expect(sum(row![2]!)).toBe(4);
    expect(lines).toHaveLength(5);
  });

  it("a key the edge refuses stops it before the sweep, exit 1", async () => {
    const run = await runLlmgw(["bench", "--url", edge.url, "--rate", "1", "--requests", "1"], {
      LLMGW_API_KEY: "sk-not-a-key",
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/refused the API key: 401 /);
    expect(run.stdout).toBe("");
  });

  it("counts engine failures and timeouts by kind and still finishes", async () => {
    const n = 10;
    let fails = 0;
    for (let k = 0; k < n; k++) if (FaultPlan.failsAt(FAULT_SEED, k, FAIL_RATE)) fails++;
    const hangs = Math.max(0, n - fails - HANG_AFTER);
    expect(fails).toBeGreaterThan(0);
    expect(hangs).toBeGreaterThan(0);
    const run = await runLlmgw([
      "bench",
      "--url",
      faulty.url,
      "--workload",
      "random",
      "--prompt-tokens",
      "20",
      "--output-tokens",
      "8",
      "--concurrency",
      "2",
      "--requests",
      String(n),
      "--timeout",
      "1s",
      "--json",
    ]);
    expect(run.code, run.stderr).toBe(0);
    const [level] = (JSON.parse(run.stdout) as BenchJson).levels;
    expect(level!.requests).toBe(n);
    expect(level!.completed).toBe(n - fails - hangs);
    expect(level!.errors).toEqual({ "500 InternalServerError": fails, timeout: hangs });
    expect(level!.successRate).toBe((n - fails - hangs) / n);
  });

  it("a target that fails every request: the warmup says so and no level runs; without one, workers back off", async () => {
    const warm = await runLlmgw(["bench", "--url", failing.url, "--concurrency", "4", "--warmup", "3"]);
    expect(warm.code).toBe(1);
    expect(warm.stderr).toMatch(
      /llmgw bench: no warmup request succeeded: 500: Simulated engine failure .*; no level was run/,
    );
    expect(warm.stdout).toBe("");

    const run = await runLlmgw([
      "bench",
      "--url",
      failing.url,
      "--concurrency",
      "4",
      "--duration",
      "3s",
      "--warmup",
      "0",
      "--json",
    ]);
    expect(run.code).toBe(1);
    const [level] = (JSON.parse(run.stdout) as BenchJson).levels;
    // Each worker waits 0.1, 0.2, 0.4, 0.8, 1.6 s after its failures: at
    // most seven requests each in 3 s, where an instant failure would
    // otherwise be sent thousands of times.
    expect(level!.completed).toBe(0);
    expect(level!.requests).toBeGreaterThanOrEqual(4);
    expect(level!.requests).toBeLessThanOrEqual(4 * 7);
  });

  it("an unreachable URL is a clear error, exit 1, at once", async () => {
    const port = await freePort();
    const run = await runLlmgw(["bench", "--url", `http://127.0.0.1:${port}`, "--rate", "1"]);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(new RegExp(`cannot reach http://127\\.0\\.0\\.1:${port}: .*ECONNREFUSED`));
    expect(run.stdout).toBe("");
  });

  it("a bad flag is named, exit 2, nothing sent", async () => {
    const before = await engineCounters(simA);
    const bad = await runLlmgw(["bench", "--url", simA.url, "--rate", "1,fast"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^llmgw bench: --rate: /);
    const unused = await runLlmgw([
      "bench",
      "--url",
      simA.url,
      "--rate",
      "1",
      "--workload",
      "random",
      "--groups",
      "3",
    ]);
    expect(unused.code).toBe(2);
    expect(unused.stderr).toMatch(/--groups: applies to the shared-prefix workload/);
    // Found out before the sweep, not after it.
    const plotDir = await runLlmgw([
      "bench",
      "--url",
      simA.url,
      "--rate",
      "1",
      "--plot",
      "/no/such/dir/p.svg",
    ]);
    expect(plotDir.code).toBe(2);
    expect(plotDir.stderr).toMatch(/--plot: cannot write in \/no\/such\/dir/);
    expect(await engineCounters(simA)).toEqual(before);
  });
});
