import { shardStateFromWire } from "../common/shard-state.ts";
import type { ShardLoad, ShardLoadReport, ShardStatus } from "../proto/gen/agent/v1/agent_pb.ts";
import type { AgentStreams } from "./agentsvc/agent-streams.ts";
import type { TokenCounter } from "./edge-status.ts";
import type { ReplicaRecord } from "./reconcile/types.ts";

/** Which shard: a replica's rank on a node. */
export interface ShardAt {
  replicaId: string;
  rank: number;
  node: string;
}

/**
 * The live load of every serving shard, the one owner of it: fed by the
 * agent streams (ShardLoadReport), read by the edge publisher and the admin
 * API. The reconciler never sees load; the board never sees lifecycle,
 * except that a shard which stopped serving, or whose node's stream went
 * away, has no load left to tell.
 */
export class LoadBoard {
  /** node → `replicaId#rank` → load */
  private readonly byNode = new Map<string, Map<string, ShardLoad>>();

  constructor(streams: Pick<AgentStreams, "subscribe">) {
    streams.subscribe({
      onShardLoad: (node, r) => this.record(node, r),
      onShardStatus: (node, s) => this.onStatus(node, s),
      onDisconnect: (node) => this.byNode.delete(node),
    });
  }

  get(at: ShardAt): ShardLoad | undefined {
    return this.byNode.get(at.node)?.get(key(at.replicaId, at.rank));
  }

  /** Each replica's generated tokens, from its rank 0 (the rank that serves and is scraped). */
  tokenCounters(replicas: readonly ReplicaRecord[]): TokenCounter[] {
    return replicas.flatMap((r) => {
      const head = r.shards.find((s) => s.rank === 0);
      const load = head && this.get({ replicaId: r.id, rank: 0, node: head.node });
      return load ? [{ model: r.model, replica: r.id, tokens: load.generationTokens }] : [];
    });
  }

  private record(node: string, r: ShardLoadReport): void {
    if (!r.load || r.load.scrapedAtUnixMs <= 0n) return;
    const shards = this.byNode.get(node) ?? new Map<string, ShardLoad>();
    shards.set(key(r.replicaId, r.rank), r.load);
    this.byNode.set(node, shards);
  }

  private onStatus(node: string, s: ShardStatus): void {
    const state = shardStateFromWire(s.state);
    if (state === "ready" || state === "draining") return;
    this.byNode.get(node)?.delete(key(s.replicaId, s.rank));
  }
}

const key = (replicaId: string, rank: number) => `${replicaId}#${rank}`;
