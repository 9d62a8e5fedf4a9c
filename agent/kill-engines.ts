import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { processAlive } from "./engine-process.ts";
import { readStateFile, STATE_FILE_NAME } from "./state-file.ts";

/**
 * Engines are detached from their agents by design, so whoever killed an
 * agent still owns the engines it left behind. This SIGKILLs every engine
 * recorded in the agents' state files under `agentsDir` (a control plane
 * handle's `<dir>/agents`, the local stack's `<state>/agents`) that is still
 * the process the file names (same /proc start time, not a reused PID),
 * whole process groups, and returns their PIDs.
 */
export function killEngines(agentsDir: string): number[] {
  if (!existsSync(agentsDir)) return [];
  const killed: number[] = [];
  for (const node of readdirSync(agentsDir)) {
    const { records } = readStateFile(join(agentsDir, node, STATE_FILE_NAME));
    for (const r of records) {
      if (!r.pid || r.pid < 2 || !processAlive(r.pid, r.startTime)) continue;
      try {
        process.kill(-r.pid, "SIGKILL");
      } catch {
        try {
          process.kill(r.pid, "SIGKILL");
        } catch {
          continue; // already gone
        }
      }
      killed.push(r.pid);
    }
  }
  return killed;
}
