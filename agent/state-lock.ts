import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";

/**
 * One agent per state directory. Two agents on one directory would both
 * adopt the same engines and both restart them when they die; the second is
 * refused at start, with the PID of the first.
 */
export class StateDirLocked extends Error {}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

export function lockStateDir(dir: string): () => void {
  const path = join(dir, "agent.lock");
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(path, "wx");
      writeSync(fd, `${process.pid}\n`);
      closeSync(fd);
      return () => {
        try {
          if (readFileSync(path, "utf8").trim() === String(process.pid)) unlinkSync(path);
        } catch {
          // already gone
        }
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      const holder = Number.parseInt(readFileSync(path, "utf8"), 10);
      if (Number.isInteger(holder) && holder > 1 && holder !== process.pid && alive(holder)) {
        throw new StateDirLocked(`state directory ${dir} is in use by another agent (pid ${holder})`);
      }
      // A stale lock from an agent that was killed: take it over.
      unlinkSync(path);
    }
  }
  throw new StateDirLocked(`could not lock state directory ${dir}`);
}
