import { create } from "@bufbuild/protobuf";
import { inventoryToProto, type NodeInventory } from "../common/inventory.ts";
import { type Register, RegisterSchema, type ShardStatus } from "../proto/gen/agent/v1/agent_pb.ts";

export interface RegisterFacts {
  nodeName: string;
  agentVersion: string;
  agentInstance: string;
  advertiseAddress: string;
  fabric: Record<string, string>;
  inventory: NodeInventory;
  shards: ShardStatus[];
}

export function buildRegister(f: RegisterFacts): Register {
  return create(RegisterSchema, {
    nodeName: f.nodeName,
    agentVersion: f.agentVersion,
    agentInstance: f.agentInstance,
    advertiseAddress: f.advertiseAddress,
    fabric: f.fabric,
    shards: f.shards,
    inventory: inventoryToProto(f.inventory),
  });
}
