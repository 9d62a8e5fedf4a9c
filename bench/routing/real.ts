/**
 * The simulation's ordering, confirmed with real processes: the edge under
 * `wrangler dev` (its ModelPool included) in front of 4 sim engines, driven
 * by `llmgw bench` as an operator would run it, once with the model's
 * routing set to `chat` and once to `round-robin`.
 *
 * The shared-prefix workload scaled down to fit: 24 groups of 2k-token
 * system prompts, 4 users each, 4 turns, 100-token questions, 32-token
 * answers; engines with a 24k-token KV cache (--sim-kv-blocks 1500), so the
 * prompts exceed one engine's cache 2× and fit the fleet's, as in the
 * simulation. Each policy gets fresh engines (a cold cache) and its own
 * model name, so its pool starts empty too. At these rates the fleet is far
 * from its knee (the simulation of this very setup agrees: the same
 * throughput for both), so what the run can confirm is TTFT, where the
 * simulation puts chat at a third of round-robin.
 */
import { spawn } from "node:child_process";
import { join } from "node:path";
import { REPO } from "../../common/processes.ts";
import { renderTable } from "../../common/text-table.ts";
import type { LevelSummary } from "../../loadgen/stats.ts";
import { ms } from "../../loadgen/stats.ts";
import {
  createKey,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
} from "../../scripts/edge-harness.ts";

const KV_BLOCKS = 1500;
const ENGINES = 4;
const POLICIES = ["chat", "round-robin"] as const;

function bench(
  url: string,
  key: string,
  model: string,
  rates: string,
  seconds: number,
): Promise<LevelSummary[]> {
  const args = [
    join(REPO, "bin", "llmgw.mjs"),
    "bench",
    "--url",
    url,
    "--model",
    model,
    "--rate",
    rates,
    "--duration",
    `${seconds}s`,
    "--workload",
    "shared-prefix",
    "--groups",
    "24",
    "--users-per-group",
    "4",
    "--system-tokens",
    "2000",
    "--question-tokens",
    "100",
    "--output-tokens",
    "32",
    "--turns",
    "4",
    "--ignore-eos",
    "--header",
    "x-llmgw-band:platinum",
    "--json",
  ];
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, args, { env: { ...process.env, LLMGW_API_KEY: key } });
    let out = "";
    let err = "";
    p.stdout.on("data", (d) => {
      out += d;
    });
    p.stderr.on("data", (d) => {
      err += d;
    });
    p.on("exit", (code) => {
      if (code !== 0) return reject(new Error(`llmgw bench exited ${code}: ${err}`));
      resolve((JSON.parse(out) as { levels: LevelSummary[] }).levels);
    });
  });
}

export async function realConfirmation(opts: { quick: boolean }): Promise<void> {
  // `wrangler dev` relays through a second workerd that tops out near 65
  // req/s here: the rates stay well under it.
  const rates = opts.quick ? "8,16" : "8,16,24";
  const seconds = opts.quick ? 20 : 30;
  process.stdout.write(
    `\n## Real processes: wrangler dev + ${ENGINES} sim engines (real time, ${KV_BLOCKS} KV blocks), llmgw bench, rates ${rates} req/s\n\n`,
  );
  const edge = await startEdge({}, "bench-edge");
  try {
    const models = POLICIES.map((p) => `sp-${p}`);
    await edge.sync.putCatalog({ models: POLICIES.map((p) => ({ name: `sp-${p}`, routing: p })) });
    // The index the pool keeps is sized like the engines' cache: 1500 blocks
    // of 16 tokens ≈ 1500 blocks of 64 characters.
    await edge.sync.putRouterSettings({
      settingsJson: JSON.stringify({ scoring: { prefix_cache_blocks: KV_BLOCKS } }),
    });
    const key = await createKey(edge, { band: "platinum" });
    const rows: string[][] = [];
    const byPolicy = new Map<string, LevelSummary[]>();
    let sims: Sim[] = [];
    for (const policy of POLICIES) {
      await Promise.all(sims.map((s) => s.stop()));
      const ports = sims.map((s) => s.port);
      sims = await Promise.all(
        Array.from({ length: ENGINES }, (_, i) =>
          startSim(
            "sp",
            [
              "--served-model-name",
              ...models,
              "--sim-speed",
              "1",
              "--sim-kv-blocks",
              String(KV_BLOCKS),
              "--enable-prompt-tokens-details",
            ],
            ports[i],
          ),
        ),
      );
      await setEndpoints(
        edge,
        sims.map((s, i) => ({ id: `sim-${i}`, url: s.url, models })),
      );
      const levels = await bench(edge.url, key.secret, `sp-${policy}`, rates, seconds);
      byPolicy.set(policy, levels);
      for (const l of levels) {
        rows.push([
          policy,
          String(l.load.value),
          String(Math.round(l.outputTokensPerSecond)),
          ms(l.ttft.p50),
          ms(l.ttft.p90),
          ms(l.ttft.p99),
          `${(l.successRate * 100).toFixed(1)} %`,
          l.cachedTokens !== undefined && l.promptTokens > 0
            ? `${((l.cachedTokens / l.promptTokens) * 100).toFixed(1)} %`
            : "-",
          Object.entries(l.routes ?? {})
            .map(([k, v]) => `${k} ${v}`)
            .join(", "),
        ]);
      }
    }
    process.stdout.write(
      `${renderTable(["policy", "req/s", "out tok/s", "TTFT p50", "TTFT p90", "TTFT p99", "success", "cached", "decided by"], rows)}\n\n`,
    );
    const chat = byPolicy.get("chat")!;
    const rr = byPolicy.get("round-robin")!;
    const same = chat.every(
      (c, i) => (c.ttft.p90 ?? Number.POSITIVE_INFINITY) < (rr[i]?.ttft.p90 ?? Number.POSITIVE_INFINITY),
    );
    process.stdout.write(
      `  ${same ? "confirmed" : "NOT confirmed"}: chat's TTFT p90 below round-robin's at every level, as in the simulation\n`,
    );
  } finally {
    await stopStarted();
  }
}
