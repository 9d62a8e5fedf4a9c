/**
 * bench:startup — what the production install saves at start-up: `llmgw`
 * from this checkout (TypeScript through tsx) beside `llmgw` from the
 * tarball `npm pack` makes, installed with --omit=dev (JavaScript compiled
 * into dist/), on the same Node, in alternating rounds so that the
 * machine's noise falls on both alike.
 *
 * Prints, per variant, min / median / max over ROUNDS (default 10) of:
 * - `llmgw --help`: spawn to exit; `node -e 0` beside it is the floor;
 * - an agent with simulated GPUs: spawn until its node is connected in the
 *   control plane (ListNodes polled every 5 ms), against one control plane.
 * One warm-up run of each goes first (tsx fills its transform cache).
 * No assertions: figures to read.
 */
import { spawn } from "node:child_process";
import { LLMGW, waitUntil } from "../common/processes.ts";
import { startAgent, startControlPlane, tempDir } from "../scripts/fleet.ts";
import { packAndInstall } from "../scripts/pack-install.ts";
import { numberKnob } from "./knobs.ts";

const ROUNDS = numberKnob("ROUNDS", 10, 1);

async function timeRun(args: string[]): Promise<number> {
  const t0 = performance.now();
  const child = spawn(process.execPath, args, { stdio: "ignore" });
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  if (code !== 0) throw new Error(`${args.join(" ")} exited ${code}`);
  return performance.now() - t0;
}

const dir = tempDir("bench-startup");
console.log("packing and installing the tarball…");
const installed = await packAndInstall(dir);
const variants = [
  { name: "checkout (tsx)", bin: LLMGW },
  { name: "installed (dist/)", bin: installed.bin },
];

const cp = await startControlPlane("", { entry: installed.bin });

let agents = 0;
async function timeAgent(entry: string): Promise<number> {
  const node = `bench-${agents++}`;
  const t0 = performance.now();
  const agent = startAgent(cp, node, { entry, advertiseAddress: "127.0.0.1" });
  await waitUntil(
    `${node} connected`,
    async () => (await cp.client.getNode({ name: node }).catch(() => undefined))?.node?.connected,
    30_000,
    5,
  );
  const ms = performance.now() - t0;
  await agent.kill();
  return ms;
}

const samples = new Map<string, number[]>();
const record = (key: string, ms: number) => samples.set(key, [...(samples.get(key) ?? []), ms]);
try {
  for (const v of variants) {
    await timeRun([v.bin, "--help"]);
    await timeAgent(v.bin);
  }
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? variants : [...variants].reverse();
    record("node -e 0", await timeRun(["-e", "0"]));
    for (const v of order) record(`llmgw --help, ${v.name}`, await timeRun([v.bin, "--help"]));
    for (const v of order) record(`agent to connected, ${v.name}`, await timeAgent(v.bin));
  }
} finally {
  await cp.proc.kill();
}

const fmt = (ms: number) => ms.toFixed(0).padStart(6);
console.log(`\n${ROUNDS} rounds, Node ${process.version}, ms:`);
console.log(`${"".padEnd(44)}   min median    max`);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
for (const [key, xs] of samples) {
  console.log(`${key.padEnd(44)} ${fmt(Math.min(...xs))} ${fmt(median(xs))} ${fmt(Math.max(...xs))}`);
}
for (const what of ["llmgw --help", "agent to connected"]) {
  const [a, b] = variants.map((v) => median(samples.get(`${what}, ${v.name}`)!));
  console.log(`${what}: installed / checkout median = ${((b! / a!) * 100).toFixed(0)} %`);
}
