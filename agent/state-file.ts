/**
 * What a restarted agent needs to re-adopt its engines: for each shard the
 * spec it was started from, the engine's PID and its /proc start time (a PID
 * alone may have been reused by an unrelated process), and its log file.
 * Written whole and atomically (temp file + rename) on every transition, so a
 * crash mid-write leaves the previous version, never half a file.
 *
 * A shard the agent stops on purpose (StopShard, a drain, an agent exiting
 * with --stop-engines-on-exit) leaves the file once its engine has exited.
 * So an engine the file lists that is gone at the next start died while no
 * agent was watching: a crash, counted as one.
 */
import { readFileSync } from "node:fs";
import { fromJson, type JsonValue, toJson } from "@bufbuild/protobuf";
import { z } from "zod";
import { writeFileAtomic } from "../common/atomic-write.ts";
import { type ShardState, shardStates } from "../common/shard-state.ts";
import { type StartShard, StartShardSchema } from "../proto/gen/agent/v1/agent_pb.ts";

export const STATE_FILE_NAME = "engines.json";
const VERSION = 1;

/** A stopped shard is forgotten, so it is never written. */
export type PersistedState = Exclude<ShardState, "stopped">;

const recordSchema = z.object({
  replicaId: z.string().min(1),
  spec: z.unknown(),
  pid: z.number().int().min(2).nullable(),
  startTime: z.string().max(32).nullable(),
  logPath: z.string().min(1),
  state: z.enum(shardStates).exclude(["stopped"]),
  sinceUnixMs: z.number(),
  failures: z.number().int().min(0).default(0),
  drainDeadlineUnixMs: z.number().nullable().default(null),
});

const fileSchema = z.object({
  version: z.literal(VERSION),
  shards: z.array(z.unknown()).max(10_000),
});

export interface ShardRecord {
  replicaId: string;
  spec: StartShard;
  pid: number | null;
  startTime: string | null;
  logPath: string;
  state: PersistedState;
  sinceUnixMs: number;
  failures: number;
  drainDeadlineUnixMs: number | null;
}

export interface ReadResult {
  records: ShardRecord[];
  /** Entries that could not be read; each is skipped, the rest are still adopted. */
  problems: string[];
}

export function readStateFile(path: string): ReadResult {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return { records: [], problems: [] };
    return { records: [], problems: [`cannot read ${path}: ${(err as Error).message}`] };
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    return { records: [], problems: [`${path} is not JSON: ${(err as Error).message}`] };
  }
  const file = fileSchema.safeParse(json);
  if (!file.success) return { records: [], problems: [`${path}: ${z.prettifyError(file.error)}`] };
  const records: ShardRecord[] = [];
  const problems: string[] = [];
  file.data.shards.forEach((raw, i) => {
    const r = recordSchema.safeParse(raw);
    if (!r.success) {
      problems.push(`shards[${i}]: ${z.prettifyError(r.error)}`);
      return;
    }
    try {
      const spec = fromJson(StartShardSchema, r.data.spec as JsonValue);
      records.push({ ...r.data, spec });
    } catch (err) {
      problems.push(`shards[${i}].spec: ${(err as Error).message}`);
    }
  });
  return { records, problems };
}

export function writeStateFile(path: string, records: readonly ShardRecord[]): void {
  const body = {
    version: VERSION,
    shards: records.map((r) => ({ ...r, spec: toJson(StartShardSchema, r.spec) })),
  };
  writeFileAtomic(path, `${JSON.stringify(body, null, 2)}\n`, 0o600);
}
