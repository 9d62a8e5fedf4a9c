/**
 * What a request's two calls to its model's pool cost in workerd: the
 * bundled pool-rtt Worker runs admit + release pairs back to back against a
 * real ModelPool in the same workerd (Miniflare, a direct socket) and
 * reports the wall time per pair. Local only: deployed, the round trip to
 * the pool's colo comes on top (docs/routing.md, where the pool lives).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Miniflare } from "miniflare";
import { freePort } from "../../common/free-ports.ts";
import { renderTable } from "../../common/text-table.ts";
import { bundleWorker, directSocket, runtimeOf } from "../../scripts/workerd.ts";

const ROUNDS = 5;
const PAIRS = 2_000;
const ISOLATES = 32;
const THROUGHPUT_PAIRS = 6_400;

export async function poolRoundTrip(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-pool-rtt-"));
  const config = join(import.meta.dirname, "pool-rtt.wrangler.toml");
  const script = bundleWorker(config, dir, "pool-rtt-worker.js");
  const direct = await directSocket();
  const mf = new Miniflare({
    ...runtimeOf(config),
    host: "127.0.0.1",
    port: await freePort(),
    modules: true,
    scriptPath: script,
    modulesRoot: dir,
    kvNamespaces: ["LLMGW_KV"],
    durableObjects: { MODEL_POOL: { className: "ModelPool", useSQLite: true } },
    ...direct.options,
  });
  try {
    await mf.ready;
    const url = await direct.url(mf);
    await fetch(`${url}/?n=200`); // warm-up: bundle, isolate, the pool's first KV read
    type Result = { n: number; ms: number; calls: number; error?: string };
    const run = async (q: string): Promise<Result> => {
      try {
        return (await (await fetch(`${url}/?${q}`)).json()) as Result;
      } catch (err) {
        // Seen now and then on this loopback socket ("other side closed"): the round again, once.
        process.stderr.write(`pool-rtt: ${q}: ${String(err)}; once more\n`);
        return (await (await fetch(`${url}/?${q}`, { headers: { connection: "close" } })).json()) as Result;
      }
    };
    const per: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const res = await run(`n=${PAIRS}`);
      per.push((res.ms * 1000) / res.n);
    }
    per.sort((a, b) => a - b);
    process.stdout.write(
      `\n## A request's pool calls in workerd, one at a time (${ROUNDS} rounds of ${PAIRS} admit + release)\n\n` +
        `  ${per.map((v) => `${v.toFixed(0)} µs`).join(", ")} per request (median ${per[Math.floor(ROUNDS / 2)]!.toFixed(0)} µs)\n`,
    );
    // One pool's ceiling: callers at once over 32 isolates, each isolate
    // coalescing its requests' calls, beside the design before it (a call
    // per admit and per release). A Durable Object is good for about 1,000
    // calls a second deployed (docs/routing.md).
    process.stdout.write(
      `\n## One pool, ${ISOLATES} isolates (${THROUGHPUT_PAIRS} admissions a round, median of ${ROUNDS} rounds)\n\n`,
    );
    const rows: string[][] = [];
    for (const callers of [ISOLATES, ISOLATES * 8]) {
      for (const mode of ["per-request", "channel"] as const) {
        const rounds: { rate: number; perAdmission: number }[] = [];
        for (let r = 0; r < ROUNDS; r++) {
          const res = await run(`n=${THROUGHPUT_PAIRS}&c=${callers}&isolates=${ISOLATES}&mode=${mode}`);
          if (res.error) throw new Error(`pool-rtt ${mode}: ${res.error}`);
          rounds.push({ rate: res.n / (res.ms / 1000), perAdmission: res.calls / res.n });
        }
        rounds.sort((a, b) => a.rate - b.rate);
        const m = rounds[Math.floor(ROUNDS / 2)]!;
        rows.push([
          mode === "channel" ? "coalesced (now)" : "a call each (before)",
          String(callers),
          String(Math.round(m.rate)),
          String(Math.round(m.rate * m.perAdmission)),
          m.perAdmission.toFixed(2),
        ]);
      }
    }
    process.stdout.write(
      `${renderTable(["design", "callers", "admissions/s", "calls/s", "calls per admission"], rows).replace(/^/gm, "  ")}\n`,
    );
  } finally {
    await mf.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}
