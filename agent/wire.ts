/** The agent's words on the stream: its domain types, converted to the wire's. */
import { create } from "@bufbuild/protobuf";
import { inventoryToProto, type NodeInventory } from "../common/inventory.ts";
import { shardStateToWire } from "../common/shard-state.ts";
import {
  type Register,
  RegisterSchema,
  type ShardStatus,
  ShardStatusSchema,
} from "../proto/gen/agent/v1/agent_pb.ts";
import type { ShardReport } from "./shard/record.ts";

export interface RegisterFacts {
  nodeName: string;
  agentVersion: string;
  agentInstance: string;
  advertiseAddress: string;
  fabric: Record<string, string>;
  inventory: NodeInventory;
  shards: readonly ShardReport[];
}

export function buildRegister(f: RegisterFacts): Register {
  return create(RegisterSchema, {
    nodeName: f.nodeName,
    agentVersion: f.agentVersion,
    agentInstance: f.agentInstance,
    advertiseAddress: f.advertiseAddress,
    fabric: f.fabric,
    shards: f.shards.map(shardStatusOf),
    inventory: inventoryToProto(f.inventory),
  });
}

export function shardStatusOf(r: ShardReport): ShardStatus {
  return create(ShardStatusSchema, {
    replicaId: r.replicaId,
    rank: r.rank,
    state: shardStateToWire(r.state),
    reason: r.reason,
    exitCode: r.exitCode ?? 0,
    hasExitCode: r.exitCode !== undefined,
    outputTail: [...r.tail],
    sinceUnixMs: BigInt(r.since),
    pid: r.pid,
    spec: r.spec,
    restartAtUnixMs: BigInt(r.restartAt ?? 0),
  });
}
