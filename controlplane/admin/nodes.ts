import { create } from "@bufbuild/protobuf";
import { inventoryToProto } from "../../common/inventory.ts";
import { type Node, NodeSchema, NodeState } from "../../proto/gen/control/v1/control_pb.ts";
import type { ClaimRefusal } from "../agentsvc/claim-refusals.ts";
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

export function nodeToProto(
  n: NodeRecord,
  intent: NodeIntent = { cordoned: false, draining: false },
  revokedAt = 0,
  refused?: ClaimRefusal,
): Node {
  return create(NodeSchema, {
    name: n.name,
    state: STATE[n.state],
    stateSinceUnixMs: BigInt(n.stateSince),
    // An awaited node was not seen by this control plane: its clock only counts toward lost.
    lastSeenUnixMs: BigInt(n.awaiting ? 0 : n.lastSeen),
    registeredAtUnixMs: BigInt(n.registeredAt),
    agentVersion: n.agentVersion,
    agentInstance: n.agentInstance,
    advertiseAddress: n.advertiseAddress,
    fabric: n.fabric,
    connected: n.connected,
    cordoned: intent.cordoned,
    draining: intent.draining,
    drainDeadlineUnixMs: BigInt(intent.drainDeadline ?? 0),
    inventory: inventoryToProto(n.inventory),
    revokedAtUnixMs: BigInt(revokedAt),
    awaitingReconnect: n.awaiting ?? false,
    ...(refused
      ? {
          lastRefusedClaim: {
            atUnixMs: BigInt(refused.at),
            reason: refused.reason,
            from: refused.from,
            serial: refused.serial ?? "",
          },
        }
      : {}),
  });
}
