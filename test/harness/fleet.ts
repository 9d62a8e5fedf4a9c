// The tests' name for the loopback fleet, which the benches share.
import { join } from "node:path";
import { readStateFile, STATE_FILE_NAME } from "../../agent/state-file.ts";

export * from "../../scripts/fleet.ts";

/**
 * The key a replica's engine was launched to require (docs/security.md,
 * engine keys), as its agent keeps it in its state file: what a test that
 * talks to an engine directly, past the edge, must send. "" while the agent
 * has no record of it.
 */
export function engineKeyOf(agentStateDir: string, replicaId: string): string {
  const { records } = readStateFile(join(agentStateDir, STATE_FILE_NAME));
  return records.find((r) => r.replicaId === replicaId)?.spec.engineApiKey ?? "";
}
