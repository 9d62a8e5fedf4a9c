/**
 * `npm start` driven the way a user drives it from a terminal: npm leads a
 * process group of its own (a terminal's foreground group), the README's
 * curl is fired the moment the banner is printed, and Ctrl-C is SIGINT to
 * the whole group, as a terminal delivers it. Every process of one run
 * inherits a marker in its environment, so what a run leaves behind is
 * found in /proc whatever the stack's own bookkeeping says.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { readStateFile, STATE_FILE_NAME } from "../agent/state-file.ts";
import { controlClient } from "../cli/ctl/client.ts";
import { freePort, freePortBlock } from "../common/free-ports.ts";
import { processArgv } from "../common/proc-fs.ts";
import { REPO } from "../common/processes.ts";

export interface StackPorts {
  edge: number;
  admin: number;
  agent: number;
  engines: [number, number];
}

/**
 * Free ports, and a block of engine ports no other test or stack is handed
 * at the same time. With `sites` > 1, `npm start -- --sites N` takes the
 * admin and agent ports after the given ones too: blocks of N.
 */
export async function stackPorts(sites = 1): Promise<StackPorts> {
  const engines = await freePortBlock(100);
  const first = async () => (sites === 1 ? freePort() : (await freePortBlock(sites))[0]!);
  return {
    edge: await freePort(),
    admin: await first(),
    agent: await first(),
    engines: [engines[0]!, engines.at(-1)!],
  };
}

export interface Banner {
  key: string;
  /** The dashboard's link, with the admin token in its fragment. */
  dashboard: string;
  /** The curl command as the banner prints it (with its line continuations). */
  curl: string;
  /** From spawning npm to the banner's last line. */
  ms: number;
}

export interface StackRun {
  /** npm's PID, which is also the process group's id. */
  pid: number;
  mark: string;
  adminUrl: string;
  stateDir: string;
  output(): string;
  banner: Promise<Banner>;
  /** npm's exit code, once it exited. */
  exited: Promise<number | null>;
  /** Ctrl-C: SIGINT to the whole group; resolves with npm's exit code and how long it took. */
  interrupt(): Promise<{ code: number | null; ms: number }>;
  /** Clean-up after a failed test: SIGKILL to every process of the run. */
  destroy(): void;
}

const MARK_VAR = "LOCAL_STACK_TEST_RUN";
const BANNER_END = "Ctrl-C stops everything.";

/** `npm start` with the ports given, and any further flags (`--sites 2`). */
export function startStack(
  stateDir: string,
  ports: StackPorts,
  bannerTimeoutMs = 150_000,
  flags: readonly string[] = [],
): StackRun {
  const mark = randomUUID();
  const started = Date.now();
  const child: ChildProcess = spawn(
    "npm",
    [
      "start",
      "--",
      "--state-dir",
      stateDir,
      "--edge-port",
      String(ports.edge),
      "--admin-port",
      String(ports.admin),
      "--agent-port",
      String(ports.agent),
      "--engine-ports",
      ports.engines.join("-"),
      ...flags,
    ],
    {
      cwd: REPO,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, [MARK_VAR]: mark },
    },
  );
  const pid = child.pid!;
  let out = "";
  let onOutput = () => {};
  for (const stream of [child.stdout!, child.stderr!]) {
    stream.on("data", (c: Buffer) => {
      out += c.toString("utf8");
      onOutput();
    });
  }
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const banner = new Promise<Banner>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`no banner within ${bannerTimeoutMs} ms:\n${out.slice(-4000)}`)),
      bannerTimeoutMs,
    );
    onOutput = () => {
      const start = out.indexOf("llmgw local stack is up");
      if (start < 0 || !out.includes(BANNER_END, start)) return;
      const ms = Date.now() - started;
      clearTimeout(timer);
      onOutput = () => {};
      const text = out.slice(start);
      const key = /API key\s+(\S+)/.exec(text)?.[1];
      const curl = /^ {2}curl [^\n]*\\\n[^\n]*\\\n[^\n]*'$/m.exec(text)?.[0];
      const dashboard = /dashboard\s+(http\S+)/.exec(text)?.[1];
      if (!key || !curl || !dashboard)
        reject(new Error(`banner without a key, a curl or the dashboard's link:\n${text}`));
      else resolve({ key, curl: curl.trim(), dashboard, ms });
    };
    void exited.then(() => reject(new Error(`npm start exited before the banner:\n${out.slice(-4000)}`)));
  });
  banner.catch(() => {});
  return {
    pid,
    mark,
    adminUrl: `http://127.0.0.1:${ports.admin}`,
    stateDir,
    output: () => out,
    banner,
    exited,
    async interrupt() {
      const t = Date.now();
      process.kill(-pid, "SIGINT");
      const code = await exited;
      return { code, ms: Date.now() - t };
    },
    destroy() {
      for (const p of stackProcesses(mark)) {
        try {
          process.kill(p.pid, "SIGKILL");
        } catch {
          // gone
        }
      }
    },
  };
}

/** Every live process carrying the run's marker in its environment, with its command line. */
export function stackProcesses(mark: string): { pid: number; argv: string[] }[] {
  const found: { pid: number; argv: string[] }[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let environ: string;
    try {
      environ = readFileSync(`/proc/${entry}/environ`, "utf8");
    } catch {
      continue; // gone, or not ours
    }
    if (!environ.split("\0").includes(`${MARK_VAR}=${mark}`)) continue;
    const argv = processArgv(Number(entry));
    if (argv) found.push({ pid: Number(entry), argv });
  }
  return found;
}

export interface CurlResult {
  status: number;
  /** The streamed text, from the chunks' deltas. */
  content: string;
  done: boolean;
  /** From starting curl to the first content chunk on its stdout. */
  firstTokenMs: number | undefined;
  output: string;
}

/** Runs the banner's curl as printed, through sh, plus flags that make curl report the HTTP status. */
export function runCurl(curl: string): Promise<CurlResult> {
  const started = Date.now();
  const child = spawn("sh", ["-c", `${curl} -sS -N -w '\\nHTTP %{http_code}\\n'`], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  let firstTokenMs: number | undefined;
  child.stdout.on("data", (c: Buffer) => {
    output += c.toString("utf8");
    if (firstTokenMs === undefined && /"content":"[^"]/.test(output)) firstTokenMs = Date.now() - started;
  });
  child.stderr.on("data", (c: Buffer) => {
    output += c.toString("utf8");
  });
  return new Promise((resolve) => {
    child.once("exit", () => {
      const status = Number(/^HTTP (\d{3})$/m.exec(output)?.[1] ?? 0);
      let content = "";
      for (const m of output.matchAll(/^data: (\{.*\})$/gm)) {
        const chunk = JSON.parse(m[1]!) as { choices?: { delta?: { content?: string } }[] };
        content += chunk.choices?.[0]?.delta?.content ?? "";
      }
      resolve({ status, content, done: /^data: \[DONE\]$/m.test(output), firstTokenMs, output });
    });
  });
}

/**
 * Crashes the stack counts right now: replicas the control plane restarted
 * or saw fail, and engines whose agent counted a failure (its state file).
 */
export async function crashesCounted(run: StackRun): Promise<string[]> {
  const crashes: string[] = [];
  // npm start keeps the admin token it requires in the state directory.
  const token = readFileSync(join(run.stateDir, "admin.token"), "utf8").trim();
  const { replicas } = await controlClient(run.adminUrl, token).listReplicas({});
  for (const r of replicas) {
    if (r.restarts > 0) crashes.push(`${r.id}: ${r.restarts} restart(s) by the control plane`);
    if (r.lastFailure) crashes.push(`${r.id}: last failure ${r.lastFailure.reason}`);
  }
  const agents = join(run.stateDir, "agents");
  for (const node of readdirSync(agents)) {
    for (const rec of readStateFile(join(agents, node, STATE_FILE_NAME)).records) {
      if (rec.failures > 0)
        crashes.push(`${node} ${rec.replicaId}: ${rec.failures} failure(s), ${rec.state}`);
    }
  }
  return crashes;
}
