/**
 * A shard's life as others see it: the status the supervisor reports to the
 * control plane, and the state file's record of it, which a restarted agent
 * reads back as a life to adopt (lifecycle.ts decides what follows).
 */
import type { ShardState } from "../../common/shard-state.ts";
import type { StartShard } from "../../proto/gen/agent/v1/agent_pb.ts";
import type { ShardLife } from "./lifecycle.ts";

/** The domain status the supervisor hands out; the stream converts it to the wire's ShardStatus. */
export interface ShardReport {
  replicaId: string;
  rank: number;
  state: ShardState;
  reason: string;
  since: number;
  exitCode?: number | undefined;
  tail: readonly string[];
  pid: number;
  /** The spec it runs; absent on a stop of a shard this agent does not know. */
  spec?: StartShard | undefined;
  /** Set while a restart is pending (the control plane leaves it to the agent). */
  restartAt?: number | undefined;
}

export function reportOf(life: ShardLife): ShardReport {
  return {
    replicaId: life.spec.replicaId,
    rank: life.spec.rank,
    state: life.state,
    reason: life.reason,
    since: life.since,
    exitCode: life.exitCode,
    tail: life.tail,
    pid: life.pid ?? 0,
    spec: life.spec,
    restartAt: life.phase.name === "backoff" ? life.phase.restartAt : undefined,
  };
}

/** The state file's word for a shard; null for one that should not outlive this agent in it. */
export function persistedState(life: ShardLife): Recorded | null {
  if (life.state === "stopped" || life.phase.name === "gone") return null;
  return {
    spec: life.spec,
    state: life.state,
    since: life.since,
    failures: life.failures,
    drainDeadlineAt:
      life.phase.name === "draining"
        ? life.phase.deadlineAt
        : life.phase.name === "adopting"
          ? life.phase.drainDeadlineAt
          : null,
  };
}

/** What a previous agent's state file says about a shard, before its process is looked for. */
export interface Recorded {
  spec: StartShard;
  state: Exclude<ShardState, "stopped">;
  since: number;
  failures: number;
  drainDeadlineAt: number | null;
}

export function fromRecord(r: Recorded): ShardLife {
  return {
    spec: r.spec,
    state: r.state,
    reason: "adopted",
    since: r.since,
    tail: [],
    pid: null,
    healthUrl: null,
    failures: r.failures,
    claimed: false,
    phase: { name: "adopting", drainDeadlineAt: r.drainDeadlineAt },
  };
}
