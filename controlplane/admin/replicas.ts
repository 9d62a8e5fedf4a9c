import { create } from "@bufbuild/protobuf";
import { shardStateToWire } from "../../common/shard-state.ts";
import type { ShardLoad } from "../../proto/gen/agent/v1/agent_pb.ts";
import {
  type ModelSummary,
  ModelSummarySchema,
  type Replica,
  ReplicaSchema,
} from "../../proto/gen/control/v1/control_pb.ts";
import type { Catalog } from "../catalog.ts";
import type { ShardAt } from "../load-board.ts";
import { replicaStatus } from "../reconcile/table.ts";
import type { ModelBackoff, ReplicaRecord, TrackedState } from "../reconcile/types.ts";
import type { Scaler } from "../scaler.ts";

/** What ctl shows for the two states only the control plane has. */
const shown = (s: TrackedState) => (s === "assigned" ? "starting" : s === "stopping" ? "draining" : s);

export function replicaToProto(
  r: ReplicaRecord,
  now: number,
  backoff: ModelBackoff | undefined,
  /** What the agent last said about a shard that the table does not keep: its PID and load. */
  live: (shard: ShardAt) => { pid?: number | undefined; load?: ShardLoad | undefined },
  /** What differs from its profile now (Reconciler.outdated). */
  outdated?: string,
): Replica {
  // A replica on its way out is dated by its stop, not by its placement.
  const since = r.retire
    ? Math.max(0, ...r.retiring.map((s) => s.since))
    : Math.min(...r.shards.map((s) => s.since), r.placedAt ?? Number.POSITIVE_INFINITY);
  const f = r.lastFailure;
  return create(ReplicaSchema, {
    id: r.id,
    model: r.model,
    profile: r.profile,
    state: replicaStatus(r, now, backoff),
    sinceUnixMs: BigInt(Number.isFinite(since) ? since : 0),
    restarts: r.restarts,
    nextAttemptUnixMs: BigInt(backoff && backoff.retryAt > now ? backoff.retryAt : (r.waiting?.until ?? 0)),
    outdated: outdated ?? "",
    ...(f
      ? {
          lastFailure: {
            reason: f.reason,
            exitCode: f.exitCode ?? 0,
            hasExitCode: f.exitCode !== undefined,
            outputTail: f.outputTail ?? [],
            atUnixMs: BigInt(f.at),
          },
        }
      : {}),
    shards: r.shards.map((s) => {
      const rt = live({ replicaId: r.id, rank: s.rank, node: s.node });
      return {
        rank: s.rank,
        nodeName: s.node,
        gpuIndices: s.gpus,
        ports: { http: s.ports.http, distInit: s.ports.distInit },
        state: shardStateToWire(shown(s.state)),
        pid: rt?.pid ?? 0,
        ...(rt?.load ? { load: rt.load } : {}),
      };
    }),
  });
}

export function modelSummaries(
  catalog: Catalog,
  replicas: readonly ReplicaRecord[],
  now: number,
  scaler?: Pick<Scaler, "view">,
): ModelSummary[] {
  return catalog.models.map((m) => {
    const mine = replicas.filter((r) => r.model === m.name && !r.retire);
    const min = m.profiles.reduce((s, p) => s + p.replicas.min, 0);
    const scaling = scaler?.view(m.name);
    return create(ModelSummarySchema, {
      name: m.name,
      aliases: [...m.aliases],
      fallbacks: [...m.fallbacks],
      routing: m.routing,
      profiles: m.profiles.map((p) => p.name),
      replicasDesired: scaling?.desired ?? min,
      replicasMin: min,
      replicasMax: m.profiles.reduce((s, p) => s + p.replicas.max, 0),
      scaling: scaling?.why ?? "",
      replicasReady: mine.filter((r) => replicaStatus(r, now) === "ready").length,
      routerOnly: m.routerOnly,
    });
  });
}
