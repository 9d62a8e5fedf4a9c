import { create } from "@bufbuild/protobuf";
import { type Inventory, InventorySchema } from "../proto/gen/agent/v1/agent_pb.ts";

/** What a node has, as its agent reports it and the control plane keeps it. */
export interface GpuInfo {
  index: number;
  uuid: string;
  name: string;
  memoryTotalMiB: number;
  memoryFreeMiB: number;
  memoryUsedMiB: number;
  pciBusId: string;
  driverVersion: string;
  computeCapability: string;
  /** VRAM held by processes llmgw did not start: not free for placement. */
  foreign: { pid: number; usedMiB: number }[];
}

export interface NodeInventory {
  gpus: GpuInfo[];
  cpuCores: number;
  ramTotalMiB: number;
  hostname: string;
  simulated: boolean;
}

/** The inventory as it travels (agent.v1.Inventory): the one conversion both ends use. */
export function inventoryToProto(inv: NodeInventory): Inventory {
  return create(InventorySchema, {
    cpuCores: inv.cpuCores,
    ramTotalMib: BigInt(inv.ramTotalMiB),
    hostname: inv.hostname,
    simulated: inv.simulated,
    gpus: inv.gpus.map((g) => ({
      index: g.index,
      uuid: g.uuid,
      name: g.name,
      memoryTotalMib: BigInt(g.memoryTotalMiB),
      memoryFreeMib: BigInt(g.memoryFreeMiB),
      memoryUsedMib: BigInt(g.memoryUsedMiB),
      pciBusId: g.pciBusId,
      driverVersion: g.driverVersion,
      computeCapability: g.computeCapability,
      foreign: g.foreign.map((f) => ({ pid: f.pid, usedMib: BigInt(f.usedMiB) })),
    })),
  });
}

export function inventoryFromProto(inv: Inventory | undefined): NodeInventory {
  return {
    cpuCores: inv?.cpuCores ?? 0,
    ramTotalMiB: Number(inv?.ramTotalMib ?? 0n),
    hostname: inv?.hostname ?? "",
    simulated: inv?.simulated ?? false,
    gpus: (inv?.gpus ?? []).map((g) => ({
      index: g.index,
      uuid: g.uuid,
      name: g.name,
      memoryTotalMiB: Number(g.memoryTotalMib),
      memoryFreeMiB: Number(g.memoryFreeMib),
      memoryUsedMiB: Number(g.memoryUsedMib),
      pciBusId: g.pciBusId,
      driverVersion: g.driverVersion,
      computeCapability: g.computeCapability,
      foreign: g.foreign.map((f) => ({ pid: f.pid, usedMiB: Number(f.usedMib) })),
    })),
  };
}
