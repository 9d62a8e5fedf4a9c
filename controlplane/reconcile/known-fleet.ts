import type { NodeRecord, RegistrationInfo } from "../registry.ts";
import type { ReplicaRecord } from "./types.ts";

/**
 * The fleet as it last stood — every node that held a live shard, and those
 * shards — kept in `data_dir/llmgw.db` (known-fleet-store.ts). A restarted control plane otherwise
 * knows only the agents that are back: a node whose agent is late would be
 * absent, its replicas missing, and placed a second time elsewhere, so that
 * the node's running engines are stopped as strays when it returns. With
 * this, such a node is awaited (unreachable, its replicas kept) until it
 * registers or `lost_after` ends the wait, like any node gone silent.
 *
 * Everything else stays rebuilt from agents: what is kept here is only a
 * claim that stands until an agent confirms or denies it.
 */
export interface KnownShard {
  rank: number;
  node: string;
  gpus: number[];
  ports: { http: number; distInit: number[] };
  state: "assigned" | "starting" | "ready" | "draining";
}

export interface KnownReplica {
  id: string;
  generation: number;
  worldNodes: number;
  shards: KnownShard[];
}

export interface KnownFleet {
  nodes: RegistrationInfo[];
  replicas: KnownReplica[];
}

const KEPT: ReadonlySet<string> = new Set(["assigned", "starting", "ready", "draining"]);

/** Pure: what to keep of the replica table and the registry now. */
export function knownFleet(replicas: readonly ReplicaRecord[], nodes: readonly NodeRecord[]): KnownFleet {
  const byName = new Map(nodes.filter((n) => n.state !== "lost").map((n) => [n.name, n]));
  const kept: KnownReplica[] = [];
  const holding = new Set<string>();
  for (const r of replicas) {
    if (r.retire) continue;
    const shards = r.shards.filter((s) => KEPT.has(s.state) && byName.has(s.node));
    // A gang is kept whole or not at all: a half is nothing to adopt.
    if (shards.length === 0 || shards.length !== r.shards.length) continue;
    kept.push({
      id: r.id,
      generation: r.generation,
      worldNodes: r.worldNodes,
      shards: shards.map((s) => ({
        rank: s.rank,
        node: s.node,
        gpus: [...s.gpus],
        ports: { http: s.ports.http, distInit: [...s.ports.distInit] },
        state: s.state as KnownShard["state"],
      })),
    });
    for (const s of shards) holding.add(s.node);
  }
  const info = (n: NodeRecord): RegistrationInfo => ({
    name: n.name,
    agentVersion: n.agentVersion,
    agentInstance: n.agentInstance,
    advertiseAddress: n.advertiseAddress,
    fabric: { ...n.fabric },
    inventory: n.inventory,
  });
  return {
    nodes: [...holding].sort().map((name) => info(byName.get(name)!)),
    replicas: kept,
  };
}
