/**
 * `npm start`: the whole local stack on loopback — the edge under
 * `wrangler dev`, a control plane, and two agents with simulated GPUs whose
 * engines are sim engines launched through the real vLLM adapter — with
 * every process's log prefixed on this terminal. It creates an API key and
 * prints how to call the edge. Ctrl-C stops everything, engines included.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { killEngines } from "../test/harness/engines.ts";

const REPO = join(import.meta.dirname, "..");
const LLMGW = join(REPO, "bin", "llmgw.mjs");
const WRANGLER = join(REPO, "node_modules", "wrangler", "bin", "wrangler.js");
const STATE = join(REPO, ".state");
const AGENTS = join(STATE, "agents");
const EDGE = "http://127.0.0.1:8787";
const ADMIN = "http://127.0.0.1:9090";
// A fresh EdgeSync secret per run: it only has to be shared by the two
// processes this script starts.
const TOKEN = randomBytes(24).toString("base64url");
const env = { ...process.env, LLMGW_EDGE_TOKEN: TOKEN };
const children: ChildProcess[] = [];
const quiet = process.argv.includes("--quiet");

function start(name: string, cmd: string[], color: number): ChildProcess {
  const child = spawn(process.execPath, cmd, { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
  const prefix = `\x1b[${color}m${name.padEnd(10)}\x1b[0m `;
  const forward = (buf: Buffer) => {
    if (quiet) return;
    for (const line of buf.toString().split("\n"))
      if (line.trim()) process.stdout.write(`${prefix}${line}\n`);
  };
  child.stdout!.on("data", forward);
  child.stderr!.on("data", forward);
  child.on("exit", (code, signal) => {
    if (!stopping) process.stdout.write(`${prefix}exited (${signal ?? code})\n`);
  });
  children.push(child);
  return child;
}

function waitForLine(child: ChildProcess, pattern: RegExp, what: string, timeoutMs = 90_000): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), timeoutMs);
    const check = (buf: Buffer) => {
      seen = (seen + buf.toString()).slice(-10_000);
      if (pattern.test(seen)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout!.on("data", check);
    child.stderr!.on("data", check);
    child.once("exit", () => reject(new Error(`${what}: process exited`)));
  });
}

async function waitFor(what: string, probe: () => Promise<boolean>, timeoutMs = 120_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await probe().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

let stopping = false;
function stop(code = 0): void {
  if (stopping) return;
  stopping = true;
  for (const c of children) c.kill("SIGTERM");
  // Engines are detached from their agents by design (they survive agent
  // restarts); the local stack owns them, so it stops them too.
  setTimeout(() => {
    killEngines(AGENTS);
    process.exit(code);
  }, 1_500);
}
process.on("SIGINT", () => stop());
process.on("SIGTERM", () => stop());
process.on("SIGHUP", () => stop());
// When whatever started us goes away without a signal reaching us (npm
// killed by a supervisor, a closed terminal), we are re-parented: stop too,
// rather than leave a fleet running nobody can see.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) stop();
}, 1_000).unref();

async function main(): Promise<void> {
  mkdirSync(AGENTS, { recursive: true });
  killEngines(AGENTS); // leftovers of a run that was killed hard

  const edge = start(
    "edge",
    [
      WRANGLER,
      "dev",
      "--ip",
      "127.0.0.1",
      "--port",
      "8787",
      "--persist-to",
      join(STATE, "edge"),
      "--show-interactive-dev-session=false",
      "--var",
      `EDGE_SYNC_TOKEN:${TOKEN}`,
    ],
    35,
  );
  const cp = start("control", [LLMGW, "server", "--config", "infra/local/llmgw.yaml"], 36);
  await Promise.all([
    waitForLine(edge, /Ready on http/, "the edge (wrangler dev)"),
    waitForLine(cp, /control plane listening/, "the control plane"),
  ]);
  const nodes: [string, string][] = [
    ["gpu-node-1", "127.0.0.11"],
    ["gpu-node-2", "127.0.0.12"],
  ];
  for (const [i, [node, address]] of nodes.entries()) {
    start(
      node,
      [
        LLMGW,
        "agent",
        "--control-plane",
        "http://127.0.0.1:7443",
        "--node",
        node,
        "--simulate-gpus",
        "8xH100-80GB",
        "--fabric",
        "ib=local-island",
        // Each simulated node has its own loopback address, so engines on
        // the two "nodes" can use the same ports as on real machines.
        "--advertise-address",
        address,
        "--state-dir",
        join(AGENTS, node),
        "--vllm-bin",
        "test/bin/vllm",
      ],
      32 + i,
    );
  }

  const created = spawnSync(
    process.execPath,
    [LLMGW, "keys", "create", "--name", "local-dev", "--band", "platinum", "--edge", EDGE, "--json"],
    { cwd: REPO, env, encoding: "utf8" },
  );
  if (created.status !== 0) throw new Error(`creating the API key failed: ${created.stderr}`);
  const { secret } = JSON.parse(created.stdout) as { secret: string };

  process.stdout.write("\nwaiting for the replicas to be placed and ready…\n");
  await waitFor("ready replicas at the edge", async () => {
    const res = await fetch(`${EDGE}/v1/models`, { headers: { authorization: `Bearer ${secret}` } });
    const models = (await res.json()) as { data?: { id: string }[] };
    const r = await fetch(`${ADMIN}/control.v1.ControlService/ListReplicas`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    const replicas = (await r.json()) as { replicas?: { state: string }[] };
    return (
      (models.data?.length ?? 0) > 0 &&
      (replicas.replicas?.length ?? 0) > 0 &&
      replicas.replicas!.every((x) => x.state === "ready")
    );
  });

  process.stdout.write(`
\x1b[1mllmgw local stack is up\x1b[0m
  edge (OpenAI API)  ${EDGE}/v1
  control plane      admin ${ADMIN}   agents http://127.0.0.1:7443
  API key            ${secret}

Call it:
  curl ${EDGE}/v1/chat/completions -H "Authorization: Bearer ${secret}" \\
    -H "Content-Type: application/json" \\
    -d '{"model":"llama-8b","messages":[{"role":"user","content":"Hello"}],"stream":true}'

  OPENAI_BASE_URL=${EDGE}/v1 OPENAI_API_KEY=${secret} node -e \\
    'new (require("openai").OpenAI)().chat.completions.create({model:"llama-8b",messages:[{role:"user",content:"Hi"}]}).then(r=>console.log(r.choices[0].message.content))'

Look around:
  npx llmgw ctl nodes | replicas | models | explain qwen-32b
  LLMGW_EDGE_TOKEN=${TOKEN} npx llmgw keys usage
  curl ${ADMIN}/metrics

Ctrl-C stops everything.
`);
}

main().catch((err) => {
  process.stderr.write(`npm start: ${(err as Error).message}\n`);
  stop(1);
});
