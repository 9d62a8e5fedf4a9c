/**
 * One engine's OS process, whether this agent spawned it or adopted it from a
 * previous agent's state file. Engines run detached in their own process
 * group with output going straight to a log file, so the agent can die,
 * restart and re-adopt without the engine noticing — no pipe to break, no
 * SIGHUP from a controlling terminal.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, fchmodSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs";
import { type EngineLaunch, redacted } from "./engines/adapter.ts";

export interface ExitInfo {
  /** Exit status, or 128+signal when killed by a signal (the shell's convention operators know). */
  code: number | null;
  signal: NodeJS.Signals | null;
  /** False for adopted processes: a non-child's exit status cannot be collected. */
  known: boolean;
  /** Set when the process never ran (e.g. spawn ENOENT). */
  error?: string;
}

export interface EngineProcess {
  readonly pid: number;
  /** /proc start time (clock ticks since boot) at launch, to tell this process from a later one with the same PID. */
  readonly startTime: string | null;
  readonly adopted: boolean;
  readonly exited: Promise<ExitInfo>;
  hasExited(): boolean;
  /** Signals the whole process group: engines fork workers that must go with them. */
  signalGroup(signal: NodeJS.Signals): void;
}

const SIGNAL_NUMBERS: Partial<Record<string, number>> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGABRT: 6,
  SIGKILL: 9,
  SIGSEGV: 11,
  SIGPIPE: 13,
  SIGTERM: 15,
};

export function exitCodeOf(code: number | null, signal: NodeJS.Signals | null): number | null {
  if (code !== null) return code;
  if (signal) return 128 + (SIGNAL_NUMBERS[signal] ?? 0);
  return null;
}

/**
 * Field 22 of /proc/<pid>/stat: when the process started, in clock ticks
 * since boot. Null where /proc is missing or the process is gone or a zombie.
 */
export function readStartTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // comm (field 2) may contain spaces and parentheses; fields after the
    // last ")" are plain. Field 3 (state) is index 0 there, field 22 index 19.
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (rest[0] === "Z" || rest[0] === "X") return null;
    return rest[19] ?? null;
  } catch {
    return null;
  }
}

function pidExists(pid: number): boolean {
  if (!(pid > 1)) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    // ESRCH: gone. EPERM: the PID now belongs to another user — not ours.
    return false;
  }
}

/** Is `pid` still the process we started (same start time), not a stranger that reused the PID? */
export function processAlive(pid: number, startTime: string | null): boolean {
  if (!pidExists(pid)) return false;
  const now = readStartTime(pid);
  if (now === null) {
    // No /proc (not Linux) leaves only the PID to go by; a zombie reads as null too.
    return startTime === null && pidExists(pid);
  }
  return startTime === null || now === startTime;
}

/**
 * Whether /proc/<pid>/cmdline mentions `text` (the model): a second guard,
 * besides the start time, against adopting — and later killing the group
 * of — a process that is not the engine the state file says. True where
 * /proc is unavailable, since there is nothing to check against.
 */
export function cmdlineMentions(pid: number, text: string): boolean {
  let cmdline: string;
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
  } catch {
    return !existsSync("/proc/self");
  }
  return cmdline.split("\0").some((arg) => arg.includes(text));
}

/**
 * Every live process in the given process groups: an engine's VRAM is
 * mostly held by workers it forked, whose PIDs nvidia-smi reports, so
 * telling our memory from foreign memory needs the whole group.
 */
export function groupMembers(pgids: ReadonlySet<number>): Set<number> {
  const out = new Set<number>();
  if (pgids.size === 0) return out;
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return new Set(pgids);
  }
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, "utf8");
      // Field 5 (pgrp) is index 2 after the command name.
      const pgrp = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[2]);
      if (pgids.has(pgrp)) out.add(Number(e));
    } catch {
      // Exited while we looked.
    }
  }
  return out;
}

/** Whether any member of the process group is left. */
export function groupAlive(pgid: number): boolean {
  // kill(-0) would address the agent's own group.
  if (!(pgid > 1)) return false;
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

function killGroup(pgid: number, signal: NodeJS.Signals): void {
  // Never 0 or 1: kill(0) signals our own group, kill(-1) every process we may signal.
  if (!(pgid > 1)) return;
  try {
    process.kill(-pgid, signal);
  } catch {
    // Already gone.
  }
}

/** Starts the engine detached, appending its stdout and stderr to `logPath`. */
export function spawnEngine(launch: EngineLaunch, logPath: string, cwd: string): EngineProcess {
  const [cmd, ...args] = launch.argv;
  if (!cmd) throw new Error("empty argv");
  // Engine logs hold full command lines and environments' effects: owner-only,
  // including a log an older release left readable.
  const fd = openSync(logPath, "a", 0o600);
  fchmodSync(fd, 0o600);
  writeSync(
    fd,
    `--- llmgw: ${new Date().toISOString()} starting: ${redacted(launch.argv.join(" "), launch.apiKey)}\n`,
  );
  let child: ChildProcess;
  try {
    child = spawn(cmd, args, {
      cwd,
      detached: true,
      stdio: ["ignore", fd, fd],
      env: { ...process.env, ...launch.env },
    });
  } finally {
    // The child holds its own copy of the descriptor.
    closeSync(fd);
  }
  child.unref();
  let done = false;
  const exited = new Promise<ExitInfo>((resolve) => {
    child.once("error", (err) => {
      done = true;
      resolve({ code: null, signal: null, known: true, error: err.message });
    });
    child.once("exit", (code, signal) => {
      done = true;
      resolve({ code: exitCodeOf(code, signal), signal, known: true });
    });
  });
  const pid = child.pid ?? 0;
  return {
    pid,
    startTime: pid ? readStartTime(pid) : null,
    adopted: false,
    exited,
    hasExited: () => done,
    // Also after the leader exited: its forked workers may linger, and Linux
    // does not hand out a PID while a process group of that id still exists.
    signalGroup: (signal) => {
      if (pid) killGroup(pid, signal);
    },
  };
}

/**
 * Takes over an engine a previous agent started. It is not our child, so
 * there is no exit event: liveness is polled (PID plus start time).
 */
export function adoptEngine(pid: number, startTime: string | null, pollMs = 1_000): EngineProcess | null {
  if (!processAlive(pid, startTime)) return null;
  let done = false;
  const exited = new Promise<ExitInfo>((resolve) => {
    const timer = setInterval(() => {
      if (processAlive(pid, startTime)) return;
      clearInterval(timer);
      done = true;
      resolve({ code: null, signal: null, known: false });
    }, pollMs);
    timer.unref();
  });
  return {
    pid,
    startTime,
    adopted: true,
    exited,
    hasExited: () => done,
    signalGroup: (signal) => {
      // While the leader lives, only if it is still ours (not a reused PID);
      // after it died, for its stragglers, as for a spawned engine.
      if (done || processAlive(pid, startTime)) killGroup(pid, signal);
    },
  };
}
