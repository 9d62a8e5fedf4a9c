/**
 * The reconciler's vocabulary: what the replica table remembers, what the
 * planner reads, and the actions it answers with. Plain data, so the plan
 * can be logged, diffed in tests and shipped over the admin API as is.
 */
import type { ShardState } from "../../common/shard-state.ts";
import type { Catalog } from "../catalog.ts";
import type {
  Assignment,
  Explanation,
  PlacementNode,
  PortAssignment,
  PortRange,
} from "../placement/types.ts";

/**
 * A shard's state as the control plane tracks it: the agent's ShardState,
 * plus the two only the control plane knows. `assigned` = StartShard sent,
 * nothing heard yet; `stopping` = StopShard/DrainShard sent.
 */
export type TrackedState = ShardState | "assigned" | "stopping";

const DEAD: ReadonlySet<TrackedState> = new Set(["stopped", "failed_startup", "failed_running"]);

/** Nothing runs: stopped, or failed. */
export const isDead = (s: TrackedState): boolean => DEAD.has(s);

export interface Failure {
  reason: string;
  exitCode?: number;
  outputTail?: string[];
  at: number;
  /**
   * False for failures that are not the model's fault (its node was lost, a
   * start command never reached the agent): the replica is placed again
   * without growing the model's backoff.
   */
  countsForBackoff: boolean;
}

export interface ShardRecord {
  rank: number;
  node: string;
  gpus: number[];
  ports: PortAssignment;
  state: TrackedState;
  since: number;
  failure?: Failure;
  /**
   * Taken back from the fleet kept across a restart (known-fleet.ts) and not
   * yet reported by its agent: a claim, not an observation.
   */
  unconfirmed?: boolean;
  /**
   * The generation a stray in `retiring` runs (one the agent reported, not
   * one this control plane retired): lets the plan reinstate a returning
   * replica over a replacement that does not serve yet.
   */
  generation?: number;
  /** A stray's spec as reported, checked against the profile before it is reinstated. */
  spec?: ShardSpecSummary;
}

/** What a shard was launched with that its profile decides (spec.ts). */
export interface ShardSpecSummary {
  engine: string;
  source: string;
  tensorParallel: number;
  pipelineParallel: number;
  dataParallel: number;
  nodes: number;
  gpusPerNode: number;
  args: string[];
  env: Record<string, string>;
  memoryFraction: number;
}

export interface ReplicaRecord {
  /** `<model>/<profile>/<n>` */
  id: string;
  model: string;
  profile: string;
  index: number;
  /** Bumped by every placement; shards of older generations are strays. */
  generation: number;
  /** Ranks of the current generation. Empty = waiting to be placed. */
  shards: ShardRecord[];
  /** Ranks the current generation has (profile.nodes when we placed it). */
  worldNodes: number;
  /** Old shards still shutting down: they hold GPUs and ports until reported stopped. */
  retiring: ShardRecord[];
  /** The whole replica is going away (surplus, drained, orphaned): drop it once `retiring` is empty. */
  retire: boolean;
  /** `reported` = learned from an agent's registration; adopted once the plan confirms it. */
  origin: "placed" | "reported";
  adopted: boolean;
  reportedAt?: number;
  /**
   * What its current generation runs: the profile's spec when it was placed,
   * then what its agent reports. Unknown for a replica kept across a restart
   * until its agent reports it.
   */
  spec?: ShardSpecSummary;
  restarts: number;
  lastFailure?: Failure;
  placedAt?: number;
  placement?: { score: number; why: string; fabric?: { key: string; value: string } };
  /** Why the last pass did not place it (for `ctl replicas` / `ctl explain`). */
  waiting?: { reason: string; until?: number; explanation?: Explanation };
}

/** Per model: failures in a row and the earliest next placement. */
export interface ModelBackoff {
  failures: number;
  retryAt: number;
  lastFailure?: Failure;
}

export interface PlanSettings {
  portRange: PortRange;
  baseBackoffMs: number;
  maxBackoffMs: number;
  /**
   * How long a reported multi-node replica with missing ranks is held for the
   * other nodes to re-register before it is restarted as a gang (defaults to
   * the control plane's startup grace).
   */
  adoptionGraceMs: number;
  /**
   * Unix ms before which nothing new is placed. A freshly started control
   * plane sets it to its start + startup grace, so replicas running on nodes
   * that have not re-registered yet are adopted when they do, instead of
   * being placed a second time elsewhere. Restarts, stops and adoption
   * proceed as usual.
   */
  placeAfter?: number;
}

export interface PlanState {
  catalog: Catalog;
  nodes: readonly PlacementNode[];
  replicas: readonly ReplicaRecord[];
  backoff: ReadonlyMap<string, ModelBackoff>;
  settings: PlanSettings;
  /**
   * Replicas per profile key from the scaling stage (scale.ts); a profile
   * it does not name keeps replicas.min. Absent: every profile keeps min.
   */
  desired?: ReadonlyMap<string, number>;
  /**
   * Replica id → the generation whose engine requires a key derived from a
   * secret rotated away (engine-keys.ts): the rollout replaces it.
   */
  retiredKeys?: ReadonlyMap<string, number>;
}

export interface ShardRef {
  node: string;
  rank: number;
}

export type Action =
  /** Start every rank of a new generation. */
  | {
      kind: "place";
      replicaId: string;
      model: string;
      profile: string;
      generation: number;
      assignment: Assignment;
      /** What it is launched with (spec.ts), so a later profile change can be told. */
      spec: ShardSpecSummary;
      reason: string;
    }
  /** Stop (or gracefully drain) these shards; with `retire`, the replica slot goes away too. */
  | {
      kind: "stop";
      replicaId: string;
      shards: ShardRef[];
      mode: "stop" | "drain";
      retire: boolean;
      reason: string;
    }
  /**
   * Gang restart: stop every live rank, forget the generation, and wait for
   * `backoff.retryAt` (if set) before placing the replica again.
   */
  | {
      kind: "restart";
      replicaId: string;
      model: string;
      stop: ShardRef[];
      /** Shards on lost nodes: forgotten without a message (nothing can reach them). */
      release: ShardRef[];
      failure: Failure;
      backoff?: ModelBackoff;
      reason: string;
    }
  /** Forget shards on a lost node (no command is sent). */
  | { kind: "release"; replicaId: string; shards: ShardRef[]; reason: string }
  /**
   * A replica that came back from a lost node serving, while its replacement
   * still starts: the returning shards are the replica again (at their
   * generation) and the replacement is stopped.
   */
  | {
      kind: "reinstate";
      replicaId: string;
      generation: number;
      shards: ShardRef[];
      stop: ShardRef[];
      reason: string;
    }
  /** A replica an agent reported matches desired state: keep it running. */
  | { kind: "adopt"; replicaId: string; generation: number; reason: string }
  /** Drop a record with nothing running (a pending slot no longer wanted). */
  | { kind: "forget"; replicaId: string; reason: string }
  /** Not placed this pass: backoff, or no room (with the explanation). */
  | {
      kind: "wait";
      replicaId: string;
      model: string;
      profile: string;
      reason: string;
      until?: number;
      explanation?: Explanation;
    };

/** What an agent says about one shard (a ShardStatus, decoded). */
export interface ObservedShard {
  replicaId: string;
  rank: number;
  generation?: number;
  state: ShardState;
  failure?: Omit<Failure, "countsForBackoff" | "at"> & { at?: number };
  gpus?: number[];
  ports?: PortAssignment;
  /** The spec it runs, from ShardStatus.spec — needed to adopt a shard the table does not know. */
  spec?: ShardSpecSummary;
  /** World size of its replica, from the spec. */
  worldNodes?: number;
}
