/**
 * Running llmgw processes from this checkout and waiting on what they do:
 * the harness the integration tests, the benchmarks and `npm run
 * check:start` share. Never part of the installed package (nothing the
 * CLI imports reaches it).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = join(dirname(fileURLToPath(import.meta.url)), "..");
export const LLMGW = join(REPO, "bin", "llmgw.mjs");

export interface Proc {
  child: ChildProcess;
  name: string;
  /** Everything the process wrote so far, stdout and stderr interleaved. */
  output(): string;
  /** Resolves when a line matching `pattern` appears (or already has). */
  waitFor(pattern: RegExp | string, timeoutMs?: number): Promise<string>;
  kill(signal?: NodeJS.Signals): Promise<void>;
  exited: Promise<number | null>;
}

/**
 * Starts `llmgw ARGS` on the project's own Node, with output captured for
 * assertions; `entry` is another llmgw to run, such as an installed one.
 */
export function startLlmgw(name: string, args: string[], env: NodeJS.ProcessEnv = {}, entry = LLMGW): Proc {
  return startProcess(name, process.execPath, [entry, ...args], env);
}

export function startProcess(name: string, cmd: string, args: string[], env: NodeJS.ProcessEnv = {}): Proc {
  const child = spawn(cmd, args, {
    cwd: REPO,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const waiters = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    out += chunk.toString("utf8");
    if (out.length > 4_000_000) out = out.slice(-2_000_000);
    for (const w of waiters) w();
  };
  child.stdout!.on("data", onData);
  child.stderr!.on("data", onData);
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  if (process.env.LLMGW_TEST_ECHO) {
    child.stderr!.on("data", (c: Buffer) => process.stderr.write(`[${name}] ${c}`));
  }
  const proc: Proc = {
    child,
    name,
    output: () => out,
    exited,
    waitFor(pattern, timeoutMs = 30_000) {
      const re =
        typeof pattern === "string" ? new RegExp(pattern.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")) : pattern;
      return new Promise((resolve, reject) => {
        const check = () => {
          const m = re.exec(out);
          if (m) {
            cleanup();
            resolve(m[0]);
          }
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`${name}: timed out waiting for ${re}; output:\n${out.slice(-4000)}`));
        }, timeoutMs);
        const onExit = () => {
          setTimeout(() => {
            cleanup();
            reject(new Error(`${name}: exited while waiting for ${re}; output:\n${out.slice(-4000)}`));
          }, 50);
        };
        const cleanup = () => {
          clearTimeout(timer);
          waiters.delete(check);
          child.off("exit", onExit);
        };
        waiters.add(check);
        child.once("exit", onExit);
        check();
      });
    },
    async kill(signal = "SIGTERM") {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill(signal);
      const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
      await exited;
      clearTimeout(timer);
    },
  };
  return proc;
}

/** Runs `llmgw ARGS` to completion and returns its output. */
export async function runLlmgw(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [LLMGW, ...args], {
    cwd: REPO,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c: Buffer) => {
    stdout += c;
  });
  child.stderr.on("data", (c: Buffer) => {
    stderr += c;
  });
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { code, stdout, stderr };
}

export async function waitUntil<T>(
  what: string,
  probe: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs = 30_000,
  everyMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Resolves once `url` answers 2xx; rejects at once if `proc` exits first. */
export async function waitForHttp(proc: Proc, url: string, timeoutMs = 30_000): Promise<void> {
  let gone = false;
  void proc.exited.then(() => {
    gone = true;
  });
  await waitUntil(
    `${proc.name} answering ${url}`,
    async () => {
      if (gone) throw new Error(`${proc.name} exited; output:\n${proc.output().slice(-4000)}`);
      const res = await fetch(url, { signal: AbortSignal.timeout(1_000) });
      await res.body?.cancel();
      return res.ok;
    },
    timeoutMs,
    50,
  ).catch((err: unknown) => {
    throw gone
      ? new Error(`${proc.name} exited before answering ${url}; output:\n${proc.output().slice(-4000)}`)
      : err;
  });
}

/** CPU time (user + system) a process has used so far, in seconds, from /proc (Linux). */
export function processCpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // utime and stime are fields 14 and 15 of stat(5); counted here from field 3 on. USER_HZ is 100 on Linux.
  return (Number(fields[11]) + Number(fields[12])) / 100;
}
