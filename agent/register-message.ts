import { create } from "@bufbuild/protobuf";
import type { NodeInventory } from "../common/inventory.ts";
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
    inventory: {
      cpuCores: f.inventory.cpuCores,
      ramTotalMib: BigInt(f.inventory.ramTotalMiB),
      hostname: f.inventory.hostname,
      simulated: f.inventory.simulated,
      gpus: f.inventory.gpus.map((g) => ({
        index: g.index,
        uuid: g.uuid,
        name: g.name,
        memoryTotalMib: BigInt(g.memoryTotalMiB),
        memoryFreeMib: BigInt(g.memoryFreeMiB),
        memoryUsedMib: BigInt(g.memoryUsedMiB),
        pciBusId: g.pciBusId,
        driverVersion: g.driverVersion,
        computeCapability: g.computeCapability,
        foreign: g.foreign.map((x) => ({ pid: x.pid, usedMib: BigInt(x.usedMiB) })),
      })),
    },
  });
}
