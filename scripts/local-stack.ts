/**
 * `npm start`: the whole local stack on loopback — a control plane and two
 * agents with simulated GPUs — with every process's log prefixed on this
 * terminal. Ctrl-C stops them all.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const REPO = join(import.meta.dirname, "..");
const LLMGW = join(REPO, "bin", "llmgw.mjs");
const STATE = join(REPO, ".state");
const children: ChildProcess[] = [];

function start(name: string, args: string[], color: number): ChildProcess {
  const child = spawn(process.execPath, [LLMGW, ...args], { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] });
  const prefix = `\x1b[${color}m${name.padEnd(8)}\x1b[0m `;
  const forward = (buf: Buffer) => {
    for (const line of buf.toString().split("\n")) if (line) process.stdout.write(`${prefix}${line}\n`);
  };
  child.stdout!.on("data", forward);
  child.stderr!.on("data", forward);
  child.on("exit", (code, signal) => {
    process.stdout.write(`${prefix}exited (${signal ?? code})\n`);
  });
  children.push(child);
  return child;
}

function waitForLine(child: ChildProcess, pattern: RegExp, timeoutMs = 30_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${pattern}`)), timeoutMs);
    const check = (buf: Buffer) => {
      if (pattern.test(buf.toString())) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout!.on("data", check);
    child.stderr!.on("data", check);
  });
}

mkdirSync(STATE, { recursive: true });
const cp = start("control", ["server", "--config", "infra/local/llmgw.yaml"], 36);
await waitForLine(cp, /control plane listening/);
const agents = [
  ["gpu-node-1", "ib=local-island"],
  ["gpu-node-2", "ib=local-island"],
];
for (const [i, [node, fabric]] of agents.entries()) {
  start(
    node!,
    [
      "agent",
      "--control-plane",
      "http://127.0.0.1:7443",
      "--node",
      node!,
      "--simulate-gpus",
      "8xH100-80GB",
      "--fabric",
      fabric!,
      "--advertise-address",
      "127.0.0.1",
      "--state-dir",
      join(STATE, node!),
    ],
    32 + i,
  );
}

process.stdout.write(`
\x1b[1mllmgw local stack is up\x1b[0m
  control plane   admin http://127.0.0.1:9090   agents http://127.0.0.1:7443
  nodes           npx llmgw ctl nodes
  metrics         curl http://127.0.0.1:9090/metrics
Ctrl-C stops everything.
`);

let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  for (const c of children) c.kill("SIGTERM");
  setTimeout(() => process.exit(0), 3_000).unref();
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
