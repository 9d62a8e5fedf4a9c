import type { Client } from "@connectrpc/connect";
import { shardStateFromWire } from "../../common/shard-state.ts";
import type { ControlService, Replica } from "../../proto/gen/control/v1/control_pb.ts";
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

export async function replicasCommand(client: Client<typeof ControlService>, json: boolean): Promise<string> {
  const rows = (await client.listReplicas({})).replicas.map(replicaJson);
  if (json) return `${JSON.stringify(rows, null, 2)}\n`;
  if (rows.length === 0) return "no replicas\n";
  const now = Date.now();
  const table = renderTable(
    ["REPLICA", "STATE", "SINCE", "NODES/RANKS", "GPUS", "PORTS", "LOAD (wait/run/kv)", "LAST FAILURE"],
    rows.map((r) => [
      r.id,
      r.state,
      ago(r.since ? Date.parse(r.since) : 0, now),
      r.shards.map((s) => `${s.node}#${s.rank}`).join(",") || "-",
      r.shards.map((s) => s.gpus.join("+")).join(",") || "-",
      r.shards.map((s) => s.ports.http).join(",") || "-",
      r.shards
        .map((s) =>
          s.load ? `${s.load.waiting}/${s.load.running}/${Math.round(s.load.kvUsage * 100)}%` : "-",
        )
        .join(","),
      r.lastFailure
        ? `${r.lastFailure.reason}${r.lastFailure.exitCode !== null ? ` (exit ${r.lastFailure.exitCode})` : ""}`
        : "-",
    ]),
  );
  return table;
}

export async function modelsCommand(client: Client<typeof ControlService>, json: boolean): Promise<string> {
  const { models } = await client.listModels({});
  const rows = models.map((m) => ({
    name: m.name,
    aliases: [...m.aliases],
    fallbacks: [...m.fallbacks],
    routing: m.routing,
    profiles: [...m.profiles],
    replicasDesired: m.replicasDesired,
    replicasReady: m.replicasReady,
    routerOnly: m.routerOnly,
  }));
  if (json) return `${JSON.stringify(rows, null, 2)}\n`;
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
