/**
 * bench:agents — 1,000 simulated agents (a few processes) against one real
 * control plane process.
 *
 * Prints: time until all are registered; control-plane memory per connected
 * agent (RSS growth from an idle control plane to one holding every stream);
 * after a kill -9 and restart of the control plane, a histogram of reconnect
 * times in one-second buckets.
 * Targets: all registered within 10 s; < 100 KiB per agent; no one-second
 * bucket with more than 10 % of the reconnects.
 */
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO } from "../common/processes.ts";
import { startControlPlane } from "../scripts/fleet.ts";

const AGENTS = Number(process.env.AGENTS ?? 1000);
const PROCESSES = Number(process.env.PROCESSES ?? 4);

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? 0);
}

async function metric(adminUrl: string, name: string): Promise<number> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, "m").exec(text);
  return Number(m?.[1] ?? 0);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const cp = await startControlPlane("control:\n  heartbeat_interval: 5s\n");
await sleep(1_500);
const idleRss = rssKiB(cp.proc.child.pid!);

type Line = { node: string; at: number; session: number };
const registrations: Line[] = [];
const start = Date.now();
const swarms = Array.from({ length: PROCESSES }, (_, p) => {
  const child = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      join(REPO, "bench", "agent-swarm.ts"),
      cp.agentUrl,
      String(AGENTS / PROCESSES),
      `node${p}`,
    ],
    { cwd: REPO, stdio: ["ignore", "pipe", "inherit"] },
  );
  let buf = "";
  child.stdout.on("data", (c: Buffer) => {
    buf += c;
    let i = buf.indexOf("\n");
    while (i >= 0) {
      registrations.push(JSON.parse(buf.slice(0, i)) as Line);
      buf = buf.slice(i + 1);
      i = buf.indexOf("\n");
    }
  });
  return child;
});

let connected = 0;
while (connected < AGENTS && Date.now() - start < 120_000) {
  await sleep(100);
  connected = await metric(cp.adminUrl, "llmgw_agent_streams");
}
const allRegisteredMs = Date.now() - start;
await sleep(3_000);
const fullRss = rssKiB(cp.proc.child.pid!);
console.error(
  `heap ${(await metric(cp.adminUrl, "nodejs_heap_used_bytes")) / 1048576} MiB, external ${(await metric(cp.adminUrl, "nodejs_external_memory_bytes")) / 1048576} MiB`,
);
const perAgentKiB = (fullRss - idleRss) / AGENTS;

// Sessions must be stable (> 1 s) before the kill so backoff starts from base.
await sleep(2_000);
const firstRound = registrations.length;
cp.proc.child.kill("SIGKILL");
await cp.proc.exited;
const killedAt = Date.now();
await cp.restart();
const upAt = Date.now();
while (registrations.length - firstRound < AGENTS && Date.now() - upAt < 180_000) await sleep(100);
const reconnects = registrations.slice(firstRound).map((r) => r.at - killedAt);

for (const s of swarms) s.kill("SIGTERM");
await cp.proc.kill();

const buckets = new Map<number, number>();
for (const t of reconnects) buckets.set(Math.floor(t / 1000), (buckets.get(Math.floor(t / 1000)) ?? 0) + 1);
const maxBucket = Math.max(...buckets.values());
const pct = (n: number) => ((100 * n) / AGENTS).toFixed(1);

console.log(`\nbench:agents — ${AGENTS} agents in ${PROCESSES} processes, one control plane\n`);
console.log(
  `all registered in            ${(allRegisteredMs / 1000).toFixed(2)} s      target < 10 s   ${allRegisteredMs < 10_000 ? "ok" : "MISSED"}`,
);
console.log(`control-plane RSS idle        ${(idleRss / 1024).toFixed(1)} MiB`);
console.log(`control-plane RSS, all conn.  ${(fullRss / 1024).toFixed(1)} MiB`);
console.log(
  `memory per connected agent    ${perAgentKiB.toFixed(1)} KiB   target < 100 KiB ${perAgentKiB < 100 ? "ok" : "MISSED"}`,
);
console.log(`\nafter kill -9 + restart (control plane down ${upAt - killedAt} ms; t=0 is the kill):`);
console.log(`reconnected                   ${reconnects.length}/${AGENTS}`);
for (const k of [...buckets.keys()].sort((a, b) => a - b)) {
  const n = buckets.get(k)!;
  console.log(
    `  ${String(k).padStart(3)}–${String(k + 1).padEnd(3)} s  ${String(n).padStart(5)}  ${pct(n).padStart(5)} %  ${"#".repeat(Math.round((50 * n) / AGENTS))}`,
  );
}
console.log(
  `largest one-second bucket     ${pct(maxBucket)} %     target <= 10 %   ${maxBucket <= AGENTS * 0.1 ? "ok" : "MISSED"}`,
);
process.exit(0);
