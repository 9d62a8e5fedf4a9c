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
import { freePort } from "../../common/processes.ts";
import { bundleWorker, directSocket, runtimeOf } from "../../scripts/workerd.ts";

const ROUNDS = 5;
const PAIRS = 2_000;
const CALLERS = 32;
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
    const per: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const res = (await (await fetch(`${url}/?n=${PAIRS}`)).json()) as { n: number; ms: number };
      per.push((res.ms * 1000) / res.n);
    }
    per.sort((a, b) => a - b);
    process.stdout.write(
      `\n## A request's two pool calls in workerd (admit + release, ${ROUNDS} rounds of ${PAIRS} pairs)\n\n` +
        `  ${per.map((v) => `${v.toFixed(0)} µs`).join(", ")} per pair (median ${per[Math.floor(ROUNDS / 2)]!.toFixed(0)} µs)\n`,
    );
    // One pool's ceiling: callers at once, as isolates would send. Each
    // admission costs two calls (admit, release); a Durable Object is good
    // for about 1,000 calls a second deployed (docs/routing.md).
    process.stdout.write(
      `\n## One pool, ${CALLERS} callers at once (${THROUGHPUT_PAIRS} admissions a round)\n\n`,
    );
    const rates: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const res = (await (await fetch(`${url}/?n=${THROUGHPUT_PAIRS}&c=${CALLERS}`)).json()) as {
        n: number;
        ms: number;
      };
      rates.push(res.n / (res.ms / 1000));
    }
    rates.sort((a, b) => a - b);
    const median = rates[Math.floor(ROUNDS / 2)]!;
    process.stdout.write(
      `  ${rates.map((v) => Math.round(v)).join(", ")} admissions/s in workerd (median ${Math.round(median)}: ${Math.round(2 * median)} calls/s)\n` +
        "  calls per admission: 2 at any load (admit, release); at ~1,000 calls/s deployed, one model's pool admits ~500/s\n",
    );
  } finally {
    await mf.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}
