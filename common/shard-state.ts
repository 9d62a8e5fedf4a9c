import { ShardState } from "../proto/gen/agent/v1/agent_pb.ts";

export type ShardStateName =
  | "unspecified"
  | "starting"
  | "ready"
  | "draining"
  | "stopped"
  | "failed_startup"
  | "failed_running";

/** `ShardState.FAILED_STARTUP` → `failed_startup`: the one spelling logs, ctl and the planner share. */
export function shardStateName(s: ShardState): ShardStateName {
  return (ShardState[s]?.toLowerCase() ?? "unspecified") as ShardStateName;
}
