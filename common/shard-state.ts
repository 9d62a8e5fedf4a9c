import { ShardState as WireShardState } from "../proto/gen/agent/v1/agent_pb.ts";

/**
 * A shard's state, the one spelling the agent, the control plane, logs, ctl
 * and the state file share. The proto enum is the wire's: it is converted
 * here, at the stream, and nowhere else.
 */
export const shardStates = [
  "starting",
  "ready",
  "draining",
  "stopped",
  "failed_startup",
  "failed_running",
] as const;
export type ShardState = (typeof shardStates)[number];

export type FailedState = Extract<ShardState, "failed_startup" | "failed_running">;

export const isFailed = (s: string): s is FailedState => s === "failed_startup" || s === "failed_running";

const TO_WIRE: Record<ShardState, WireShardState> = {
  starting: WireShardState.STARTING,
  ready: WireShardState.READY,
  draining: WireShardState.DRAINING,
  stopped: WireShardState.STOPPED,
  failed_startup: WireShardState.FAILED_STARTUP,
  failed_running: WireShardState.FAILED_RUNNING,
};

export function shardStateToWire(s: ShardState): WireShardState {
  return TO_WIRE[s];
}

/** Undefined for `UNSPECIFIED` and values this build does not know. */
export function shardStateFromWire(s: WireShardState): ShardState | undefined {
  return shardStates.find((name) => TO_WIRE[name] === s);
}
