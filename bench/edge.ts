/**
 * bench:edge — what the edge adds on the request path (auth, ledger
 * admission, pick, usage-sniffing proxy), measured in one run against the
 * same sim engine called directly and through a bare pass-through Worker
 * (bench/passthrough-worker.ts) in the same `wrangler dev`/workerd setup.
 *
 * Both Workers run in workerd through Miniflare, bundled exactly as
 * `wrangler deploy` would bundle them (`wrangler deploy --dry-run
 * --outdir`). Not through `wrangler dev`: its ProxyWorker (a second workerd
 * instance relaying over HTTP, plus per-request logging in Node) caps both
 * Workers at ~65 req/s on this machine and would hide what is measured.
 *
 * Streamed chat completions at a fixed concurrency; TTFT = request start to
 * the first SSE data event at the client. Targets are run in rotating
 * rounds so drift on a noisy machine hits all three alike.
 * Targets: edge p50 TTFT within 2 ms of the pass-through, and at least
 * 80 % of its requests per second.
 *
 * Also printed: CPU time of the Worker's own workerd process per request
 * (from /proc), which unlike req/s does not depend on what else the machine
 * is running.
 *
 * Env: CONCURRENCY (16), REQUESTS per target per round (400), ROUNDS (3),
 * MAX_TOKENS (16), SIM_SPEED (1000).
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
// Miniflare ships with wrangler (same workerd build); not a direct dependency.
import { Miniflare } from "miniflare";
import {
  bundleWorker,
  createKey,
  runtimeOf,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
} from "../test/edge/helpers.ts";
import { freePort, REPO } from "../test/harness/process.ts";

const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const REQUESTS = Number(process.env.REQUESTS ?? 400);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const MAX_TOKENS = Number(process.env.MAX_TOKENS ?? 16);
const SIM_SPEED = process.env.SIM_SPEED ?? "1000";

interface Target {
  name: string;
  url: string;
  /** The workerd process serving it, for CPU per request (undefined: not a Worker). */
  pid?: number | undefined;
  cpuMs: number;
  headers: Record<string, string>;
  ttft: number[];
  ms: number;
  done: number;
  errors: number;
}

async function one(t: Target, i: number): Promise<void> {
  const t0 = performance.now();
  const res = await fetch(`${t.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...t.headers },
    body: JSON.stringify({
      model: "bench",
      messages: [{ role: "user", content: `Request ${i % 50}: tell me something.` }],
      max_tokens: MAX_TOKENS,
      stream: true,
    }),
  });
  if (res.status !== 200 || !res.body) {
    t.errors++;
    await res.text().catch(() => {});
    return;
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let first = true;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (first && dec.decode(value, { stream: true }).includes("data: ")) {
      t.ttft.push(performance.now() - t0);
      first = false;
    }
  }
  t.done++;
}

/** CPU time (user + system) a process has used, in ms. */
function cpuMs(pid: number | undefined): number {
  if (pid === undefined) return 0;
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  // utime and stime are fields 14 and 15 of stat, in clock ticks (100 per second on Linux).
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/** The workerd process Miniflare started for the Worker listening on `port`. */
function workerdPid(port: number): number | undefined {
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, "utf8");
      if (cmd.includes("workerd") && cmd.includes(`entry=127.0.0.1:${port}\0`)) return Number(d);
    } catch {
      // gone already
    }
  }
  return undefined;
}

async function run(t: Target, n: number, record: boolean): Promise<void> {
  const scratch: Target = { ...t, ttft: [], ms: 0, done: 0, errors: 0, cpuMs: 0 };
  const target = record ? t : scratch;
  let next = 0;
  const cpu0 = cpuMs(t.pid);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < n) await one(target, next++);
    }),
  );
  if (record) {
    t.ms += performance.now() - t0;
    t.cpuMs += cpuMs(t.pid) - cpu0;
  }
}

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
}

async function main(): Promise<void> {
  process.stderr.write("bundling, starting sim engine, edge and pass-through Worker...\n");
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-edge-"));
  const passConfig = join(REPO, "bench", "passthrough.wrangler.toml");
  const passScript = bundleWorker(passConfig, dir, "passthrough-worker.js");
  const sim = await startSim("bench", ["--sim-speed", SIM_SPEED, "--max-num-seqs", "512"]);
  const edge = await startEdgeMiniflare();
  const passMf = new Miniflare({
    ...runtimeOf(passConfig),
    host: "127.0.0.1",
    modules: true,
    scriptPath: passScript,
    modulesRoot: dir,
    port: await freePort(),
    bindings: { UPSTREAM: sim.url },
  });
  const edgeUrl = edge.url;
  const passUrl = String(await passMf.ready).replace(/\/$/, "");
  try {
    await setEndpoints(edge, [{ id: "bench-1", url: sim.url, models: ["bench"] }]);
    const key = await createKey(edge);
    const mk = (name: string, url: string, headers: Record<string, string> = {}, pid?: number): Target => ({
      name,
      url,
      headers,
      pid,
      cpuMs: 0,
      ttft: [],
      ms: 0,
      done: 0,
      errors: 0,
    });
    const targets = [
      mk("engine direct", sim.url),
      mk("bare pass-through Worker", passUrl, {}, workerdPid(Number(new URL(passUrl).port))),
      mk(
        "llmgw edge",
        edgeUrl,
        { authorization: `Bearer ${key.secret}` },
        workerdPid(Number(new URL(edgeUrl).port)),
      ),
    ];
    process.stderr.write("warming up...\n");
    for (const t of targets) await run(t, 200, false);
    for (let r = 0; r < ROUNDS; r++) {
      for (let k = 0; k < targets.length; k++) {
        const t = targets[(k + r) % targets.length]!;
        process.stderr.write(`round ${r + 1}/${ROUNDS}: ${t.name}\n`);
        await run(t, REQUESTS, true);
      }
    }
    const pt = targets[1]!;
    const ptP50 = pct(pt.ttft, 50);
    const ptRps = (pt.done / pt.ms) * 1000;
    const rows = targets.map((t) => {
      const rps = (t.done / t.ms) * 1000;
      return [
        t.name,
        pct(t.ttft, 50).toFixed(2),
        pct(t.ttft, 99).toFixed(2),
        rps.toFixed(0),
        (pct(t.ttft, 50) - ptP50).toFixed(2),
        `${((rps / ptRps) * 100).toFixed(0)} %`,
        t.pid === undefined ? "-" : (t.cpuMs / t.done).toFixed(2),
        String(t.errors),
      ];
    });
    const header = [
      "target",
      "TTFT p50 ms",
      "TTFT p99 ms",
      "req/s",
      "Δp50 vs pass-through ms",
      "req/s vs pass-through",
      "workerd CPU ms/req",
      "errors",
    ];
    const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
    const line = (cells: string[]) => `| ${cells.map((c, i) => c.padEnd(widths[i]!)).join(" | ")} |`;
    process.stdout.write(
      `\nbench:edge — streamed chat, max_tokens ${MAX_TOKENS}, concurrency ${CONCURRENCY}, ${ROUNDS}×${REQUESTS} requests per target, sim-speed ${SIM_SPEED}\n\n`,
    );
    process.stdout.write(
      `${[line(header), line(widths.map((w) => "-".repeat(w))), ...rows.map(line)].join("\n")}\n`,
    );
    const e = targets[2]!;
    const dP50 = pct(e.ttft, 50) - ptP50;
    const ratio = ((e.done / e.ms) * 1000) / ptRps;
    process.stdout.write(
      `\ntargets: p50 TTFT within 2 ms of pass-through: ${dP50 <= 2 ? "met" : "MISSED"} (${dP50.toFixed(2)} ms); ` +
        `≥ 80 % of its req/s: ${ratio >= 0.8 ? "met" : "MISSED"} (${(ratio * 100).toFixed(0)} %)\n`,
    );
  } finally {
    await Promise.all([edge.stop(), passMf.dispose(), sim.stop()]);
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`bench:edge failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exitCode = 1;
});
