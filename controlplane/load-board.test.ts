import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { shardStateToWire } from "../common/shard-state.ts";
import { ShardLoadReportSchema, ShardStatusSchema } from "../proto/gen/agent/v1/agent_pb.ts";
import type { AgentStreamListener } from "./agentsvc/agent-streams.ts";
import { LoadBoard } from "./load-board.ts";

function board() {
  const listeners: AgentStreamListener[] = [];
  const b = new LoadBoard({ subscribe: (l) => listeners.push(l) });
  const emit = <K extends keyof AgentStreamListener>(
    k: K,
    ...args: Parameters<NonNullable<AgentStreamListener[K]>>
  ) => {
    for (const l of listeners) (l[k] as ((...a: typeof args) => void) | undefined)?.(...args);
  };
  const load = (node: string, replicaId: string, rank: number, running: number, scrapedAtUnixMs = 1n) =>
    emit(
      "onShardLoad",
      node,
      create(ShardLoadReportSchema, { replicaId, rank, load: { running, kvUsage: 0.5, scrapedAtUnixMs } }),
    );
  const status = (
    node: string,
    replicaId: string,
    state: "ready" | "draining" | "stopped" | "failed_running",
  ) =>
    emit(
      "onShardStatus",
      node,
      create(ShardStatusSchema, { replicaId, rank: 0, state: shardStateToWire(state) }),
    );
  return { b, emit, load, status };
}

describe("the load board", () => {
  it("keeps each shard's latest load, apart by replica, rank and node", () => {
    const { b, load } = board();
    load("n1", "m/p/0", 0, 3);
    load("n1", "m/p/0", 0, 5);
    load("n2", "m/p/0", 0, 7);
    load("n1", "m/p/0", 1, 9);
    expect(b.get({ replicaId: "m/p/0", rank: 0, node: "n1" })?.running).toBe(5);
    expect(b.get({ replicaId: "m/p/0", rank: 0, node: "n2" })?.running).toBe(7);
    expect(b.get({ replicaId: "m/p/0", rank: 1, node: "n1" })?.running).toBe(9);
    expect(b.get({ replicaId: "m/p/1", rank: 0, node: "n1" })).toBeUndefined();
  });

  it("ignores a report that was never scraped", () => {
    const { b, load } = board();
    load("n1", "m/p/0", 0, 3, 0n);
    expect(b.get({ replicaId: "m/p/0", rank: 0, node: "n1" })).toBeUndefined();
  });

  it("forgets a shard that stopped serving, and a node whose stream went away; state changes do not touch load", () => {
    const { b, emit, load, status } = board();
    load("n1", "m/p/0", 0, 3);
    load("n1", "m/p/1", 0, 4);
    load("n2", "m/p/2", 0, 5);
    status("n1", "m/p/0", "draining");
    expect(b.get({ replicaId: "m/p/0", rank: 0, node: "n1" })?.running).toBe(3);
    status("n1", "m/p/0", "failed_running");
    expect(b.get({ replicaId: "m/p/0", rank: 0, node: "n1" })).toBeUndefined();
    expect(b.get({ replicaId: "m/p/1", rank: 0, node: "n1" })?.running).toBe(4);
    emit("onDisconnect", "n1");
    expect(b.get({ replicaId: "m/p/1", rank: 0, node: "n1" })).toBeUndefined();
    expect(b.get({ replicaId: "m/p/2", rank: 0, node: "n2" })?.running).toBe(5);
  });
});
