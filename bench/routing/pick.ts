/**
 * What one routing decision costs the ModelPool: PoolCore.admit (flow
 * control, candidates, the picker's stages, the prefix lookup, recording
 * the decision) and release, for the `chat` policy at 64 endpoints, each
 * with fresh load and a prefix index at capacity. The prompts are 16 KiB
 * (256 blocks, the most the edge hashes), in groups sharing their start, and
 * every request has a session. Timed one call at a time with
 * performance.now(), after a warm-up; the target is 50 µs per pick.
 */
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../../edge/config/router.ts";
import { PoolCore } from "../../edge/routing/pool-core.ts";
import { BLOCK_CHARS, blockHashes, MAX_BLOCKS } from "../../edge/routing/prefix-hash.ts";
import { percentile } from "../../loadgen/stats.ts";
import { benchEndpoints } from "./endpoints.ts";

const ENDPOINTS = 64;
const GROUPS = 400;
const PICKS = 20_000;
const WARMUP = 5_000;

export function pickBenchmark(): void {
  const random = mulberry32(7);
  const settings = routerSchema.parse({ scoring: { target_inflight: 256 } });
  const pool = new PoolCore("m", settings, random);
  pool.setEndpoints(1, benchEndpoints(ENDPOINTS), 0);
  // Each group: one shared start of 192 blocks, each request its own tail.
  const starts = Array.from({ length: GROUPS }, (_, g) =>
    `group ${g} `.padEnd(BLOCK_CHARS * 192, `${g % 10}`),
  );
  const prompt = (g: number, i: number) =>
    blockHashes(`${starts[g]}${`request ${i} `.padEnd(BLOCK_CHARS * (MAX_BLOCKS - 192), "x")}`, "m");
  const prompts = Array.from({ length: 2_000 }, (_, i) => ({ g: i % GROUPS, hashes: prompt(i % GROUPS, i) }));
  const now = 1_000;
  pool.updateLoad(
    Array.from({ length: ENDPOINTS }, (_, i) => ({
      endpoint: `e${i}`,
      sample: {
        waiting: Math.floor(random() * 3),
        running: 40 + Math.floor(random() * 40),
        kvUsage: 0.3 + random() * 0.4,
        prefixCacheHitRate: 0.5,
        at: now,
        state: "ready" as const,
      },
    })),
    now,
  );
  const admitUs: number[] = [];
  const releaseUs: number[] = [];
  let held: string[] = [];
  for (let i = 0; i < WARMUP + PICKS; i++) {
    const p = prompts[i % prompts.length]!;
    const id = `r${i}`;
    const t0 = performance.now();
    pool.admit(
      {
        id,
        band: "platinum",
        key: `k${p.g}`,
        policy: "chat",
        session: `s${i % 5_000}`,
        prefix: p.hashes,
        // As the Worker sends it: the charge looks up the picked endpoint's cached blocks.
        demand: { promptTokens: p.hashes.length * 16, outputTokens: 200 },
      },
      now,
      () => {},
    );
    const t1 = performance.now();
    held.push(id);
    // Keep about 16 requests in flight per endpoint: releases interleave.
    if (held.length > ENDPOINTS * 16) {
      const r = held.shift()!;
      const t2 = performance.now();
      pool.release(r, { attempts: [] }, now);
      if (i >= WARMUP) releaseUs.push((performance.now() - t2) * 1000);
    }
    if (i >= WARMUP) admitUs.push((t1 - t0) * 1000);
  }
  held = [];
  const sorted = (a: number[]) => [...a].sort((x, y) => x - y);
  const a = sorted(admitUs);
  const r = sorted(releaseUs);
  const mean = (x: number[]) => x.reduce((s, v) => s + v, 0) / x.length;
  const st = pool.status(now);
  process.stdout.write(
    `\n## One pick (PoolCore.admit, chat, ${ENDPOINTS} endpoints, 256-block prompts, sessions; ${PICKS} picks)\n\n` +
      `  admit:   mean ${mean(a).toFixed(1)} µs, p50 ${percentile(a, 50)!.toFixed(1)} µs, p99 ${percentile(a, 99)!.toFixed(1)} µs\n` +
      `  release: mean ${mean(r).toFixed(1)} µs, p50 ${percentile(r, 50)!.toFixed(1)} µs, p99 ${percentile(r, 99)!.toFixed(1)} µs\n` +
      `  decided by: ${Object.entries(st.routes)
        .filter(([, v]) => v > 0)
        .map(([k, v]) => `${k} ${v}`)
        .join(
          ", ",
        )}; prefix blocks held per endpoint ≈ ${Math.round(st.endpoints.reduce((s, e) => s + e.prefixBlocks, 0) / ENDPOINTS)}\n` +
      `  ${mean(a) < 50 ? "met" : "MISSED"}  mean pick under 50 µs\n`,
  );
}
