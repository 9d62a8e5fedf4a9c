import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { readStateFile, STATE_FILE_NAME } from "../../agent/state-file.ts";

/**
 * Engines are detached from their agents by design, so a test that killed
 * an agent still owns the engines it left behind. This kills every engine
 * recorded in the agents' state files under `agentsDir` (a control plane
 * handle's `<dir>/agents`), whole process groups, so none outlives the test.
 */
export function killEngines(agentsDir: string): number {
  if (!existsSync(agentsDir)) return 0;
  let killed = 0;
  for (const node of readdirSync(agentsDir)) {
    const { records } = readStateFile(join(agentsDir, node, STATE_FILE_NAME));
    for (const r of records) {
      if (!r.pid || r.pid < 2) continue;
      try {
        process.kill(-r.pid, "SIGKILL");
        killed++;
      } catch {
        try {
          process.kill(r.pid, "SIGKILL");
          killed++;
        } catch {
          // already gone
        }
      }
    }
  }
  return killed;
}
