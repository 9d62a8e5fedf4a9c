import { readFileSync } from "node:fs";

/** `/proc/<pid>/cmdline` as argv; null when the process is gone. */
export function processArgv(pid: number): string[] | null {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    return raw.length === 0 ? null : raw.replace(/\0$/, "").split("\0");
  } catch {
    return null;
  }
}

/** True while `pid` exists and is not a zombie. */
export function processRunning(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !/^\d+ \(.*\) Z /.test(stat);
  } catch {
    return false;
  }
}
