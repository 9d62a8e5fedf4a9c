import { create } from "@bufbuild/protobuf";
import { InventorySchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { type Node, NodeSchema, NodeState } from "../../proto/gen/control/v1/control_pb.ts";
import type { NodeRecord } from "../registry.ts";

const STATE: Record<NodeRecord["state"], NodeState> = {
  ready: NodeState.READY,
  unreachable: NodeState.UNREACHABLE,
  lost: NodeState.LOST,
};

export interface NodeIntent {
  cordoned: boolean;
  draining: boolean;
  drainDeadline?: number;
}

export function nodeToProto(n: NodeRecord, intent: NodeIntent = { cordoned: false, draining: false }): Node {
  return create(NodeSchema, {
    name: n.name,
    state: STATE[n.state],
    stateSinceUnixMs: BigInt(n.stateSince),
    lastSeenUnixMs: BigInt(n.lastSeen),
    registeredAtUnixMs: BigInt(n.registeredAt),
    agentVersion: n.agentVersion,
    agentInstance: n.agentInstance,
    advertiseAddress: n.advertiseAddress,
    fabric: n.fabric,
    connected: n.connected,
    cordoned: intent.cordoned,
    draining: intent.draining,
    drainDeadlineUnixMs: BigInt(intent.drainDeadline ?? 0),
    inventory: create(InventorySchema, {
      cpuCores: n.inventory.cpuCores,
      ramTotalMib: BigInt(n.inventory.ramTotalMiB),
      hostname: n.inventory.hostname,
      simulated: n.inventory.simulated,
      gpus: n.inventory.gpus.map((g) => ({
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
    }),
  });
}
