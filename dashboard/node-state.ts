import { type Node, NodeState } from "../proto/gen/control/v1/control_pb.ts";

/**
 * One word for a node, the most pressing first: an operator's cordon or
 * drain matters only while the node is reachable.
 */
export type NodeWord =
  | "revoked"
  | "lost"
  | "awaiting"
  | "unreachable"
  | "draining"
  | "cordoned"
  | "ready"
  | "unknown";

const STATE_NAME: Partial<Record<NodeState, string>> = {
  [NodeState.READY]: "ready",
  [NodeState.UNREACHABLE]: "unreachable",
  [NodeState.LOST]: "lost",
};

/** The lifecycle state alone (ready, unreachable, lost), which `state_since` dates. */
export const nodeStateName = (n: Node): string => STATE_NAME[n.state] ?? "unknown";

export function nodeWord(n: Node): NodeWord {
  if (n.revokedAtUnixMs > 0n) return "revoked";
  if (n.state === NodeState.LOST) return "lost";
  // Known from before a control plane restart, its agent not back yet: expected, not a fault.
  if (n.awaitingReconnect) return "awaiting";
  if (n.state === NodeState.UNREACHABLE) return "unreachable";
  if (n.state !== NodeState.READY) return "unknown";
  if (n.draining) return "draining";
  if (n.cordoned) return "cordoned";
  return "ready";
}
