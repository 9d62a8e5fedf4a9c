import type { Client } from "@connectrpc/connect";
import { shardStateFromWire } from "../../common/shard-state.ts";
import type { ControlService, ModelSummary, Replica } from "../../proto/gen/control/v1/control_pb.ts";
import { ago, renderTable } from "./table.ts";

const iso = (ms: bigint) => (ms > 0n ? new Date(Number(ms)).toISOString() : null);

/** The shape `llmgw ctl replicas --json` promises scripts. */
export function replicaJson(r: Replica) {
  return {
    id: r.id,
    model: r.model,
    profile: r.profile,
    state: r.state,
    since: iso(r.sinceUnixMs),
    restarts: r.restarts,
    nextAttempt: iso(r.nextAttemptUnixMs),
    outdated: r.outdated || null,
    shards: r.shards.map((s) => ({
      rank: s.rank,
      node: s.nodeName,
      state: shardStateFromWire(s.state) ?? "unspecified",
      gpus: [...s.gpuIndices],
      ports: { http: s.ports?.http ?? 0, distInit: [...(s.ports?.distInit ?? [])] },
      pid: s.pid || null,
      load: s.load
        ? {
            waiting: s.load.waiting,
            running: s.load.running,
            kvUsage: s.load.kvUsage,
            prefixCacheHitRate: s.load.prefixCacheHitRate,
            scrapedAt: iso(s.load.scrapedAtUnixMs),
          }
        : null,
    })),
    lastFailure: r.lastFailure
      ? {
          reason: r.lastFailure.reason,
          exitCode: r.lastFailure.hasExitCode ? r.lastFailure.exitCode : null,
          outputTail: [...r.lastFailure.outputTail],
          at: iso(r.lastFailure.atUnixMs),
        }
      : null,
  };
}

export type ReplicaJson = ReturnType<typeof replicaJson>;

export async function replicasCommand(client: Client<typeof ControlService>, json: boolean): Promise<string> {
  const rows = (await client.listReplicas({})).replicas.map(replicaJson);
  return json ? `${JSON.stringify(rows, null, 2)}\n` : replicasTable(rows);
}

export function replicasTable(rows: readonly ReplicaJson[], now = Date.now()): string {
  if (rows.length === 0) return "no replicas\n";
  return renderTable(
    ["REPLICA", "STATE", "SINCE", "NODES/RANKS", "GPUS", "PORTS", "LOAD (wait/run/kv)", "LAST FAILURE"],
    rows.map((r) => [
      r.id,
      // What differs is in `ctl explain` and --json; a column of it would be most of the table.
      r.outdated ? `${r.state}, outdated` : r.state,
      ago(r.since ? Date.parse(r.since) : 0, now),
      r.shards.map((s) => `${s.node}#${s.rank}`).join(",") || "-",
      r.shards.map((s) => s.gpus.join("+")).join(",") || "-",
      r.shards.map((s) => s.ports.http).join(",") || "-",
      r.shards
        .map((s) =>
          s.load ? `${s.load.waiting}/${s.load.running}/${Math.round(s.load.kvUsage * 100)}%` : "-",
        )
        .join(","),
      r.lastFailure ? failureNote(r.lastFailure, now) : "-",
    ]),
  );
}

/**
 * LAST FAILURE: the reason, dated. An agent's reason ends with what it
 * planned at the time ("; restart 1 in 10s"); once that moment has passed
 * it is told as past, or the column would announce a restart long done.
 */
export function failureNote(f: NonNullable<ReplicaJson["lastFailure"]>, now: number): string {
  const at = f.at ? Date.parse(f.at) : 0;
  let reason = f.reason;
  const planned = /; restart (\d+) in (\d+(?:\.\d+)?)s$/.exec(reason);
  if (planned && at > 0 && at + Number(planned[2]) * 1000 <= now)
    reason = `${reason.slice(0, planned.index)}; restart ${planned[1]} was due ${planned[2]}s after`;
  const exit = f.exitCode !== null ? ` (exit ${f.exitCode})` : "";
  return `${reason}${exit}${at > 0 ? `, ${ago(at, now)} ago` : ""}`;
}

/** The shape `llmgw ctl models --json` promises scripts. */
export function modelJson(m: ModelSummary) {
  return {
    name: m.name,
    aliases: [...m.aliases],
    fallbacks: [...m.fallbacks],
    routing: m.routing,
    profiles: [...m.profiles],
    replicasDesired: m.replicasDesired,
    replicasReady: m.replicasReady,
    routerOnly: m.routerOnly,
  };
}
export type ModelJson = ReturnType<typeof modelJson>;

export async function modelsCommand(client: Client<typeof ControlService>, json: boolean): Promise<string> {
  const rows = (await client.listModels({})).models.map(modelJson);
  return json ? `${JSON.stringify(rows, null, 2)}\n` : modelsTable(rows);
}

export function modelsTable(rows: readonly ModelJson[]): string {
  if (rows.length === 0) return "no models in the catalog\n";
  return renderTable(
    ["MODEL", "ALIASES", "ROUTING", "PROFILES", "READY/DESIRED", "FALLBACKS"],
    rows.map((m) => [
      m.name,
      m.aliases.join(",") || "-",
      m.routing,
      m.routerOnly ? "(router-only)" : m.profiles.join(","),
      m.routerOnly ? "-" : `${m.replicasReady}/${m.replicasDesired}`,
      m.fallbacks.join(",") || "-",
    ]),
  );
}
