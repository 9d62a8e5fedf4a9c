/**
 * What placement sees and what it answers. A snapshot, not the registry:
 * the control plane builds these from its node registry and replica table,
 * a test or benchmark builds them by hand, and placement never reaches back
 * into either.
 */
import type { CatalogProfile } from "../catalog.ts";

export type NodeState = "ready" | "unreachable" | "lost";

export interface PlacementGpu {
  index: number;
  name: string;
  memoryTotalMiB: number;
  /**
   * Total minus what processes llmgw did not start are using. GPUs held by
   * llmgw's own shards are in `allocatedGpus` instead: their memory is
   * accounted by allocation, not by the agent's free-memory reading.
   */
  memoryFreeMiB: number;
}

export interface PlacementNode {
  name: string;
  state: NodeState;
  /** Operator intent: place nothing new here. */
  cordoned: boolean;
  /** Operator intent: move everything away, by `drainDeadline` at the latest. */
  draining: boolean;
  /** Unix ms after which shards on a draining node are stopped even without a replacement. */
  drainDeadline?: number;
  /** Operator-given labels (e.g. `ib: pod-a`); multi-node replicas need one shared value. */
  fabric: Readonly<Record<string, string>>;
  gpus: readonly PlacementGpu[];
  /** GPU indices held by shards the caller knows about. Unioned with the replica table's own. */
  allocatedGpus: ReadonlySet<number>;
  /** Ports held on the node (our shards, or anything the agent reports bound). */
  usedPorts: ReadonlySet<number>;
}

export interface PortRange {
  first: number;
  last: number;
}

/** The profile fields placement reads; a CatalogProfile satisfies it. */
export type PlacementProfile = Pick<
  CatalogProfile,
  | "key"
  | "engine"
  | "gpusPerNode"
  | "nodes"
  | "dataParallel"
  | "gpuModel"
  | "minMemoryMiB"
  | "memoryFraction"
  | "fabric"
  | "strategy"
> & { replicas: { min: number } };

export interface PortAssignment {
  /** The engine's HTTP port (on headless vLLM ranks it is reserved but unused). */
  http: number;
  /**
   * Distributed-init ports this rank binds, in the engine's order (see
   * ports.ts): vLLM `[master_port, dp_rpc_port?, dp_master_band_start?]`,
   * SGLang the dist-init block starting at `--dist-init-addr`'s port.
   */
  distInit: number[];
}

export interface ShardAssignment {
  rank: number;
  node: string;
  gpus: number[];
  ports: PortAssignment;
}

export interface Assignment {
  shards: ShardAssignment[];
  /** Higher is better; see stages.ts `scoreNode`. */
  score: number;
  /** One line: why these nodes. */
  why: string;
  fabric?: { key: string; value: string };
}

/**
 * Why a node cannot host a rank, in pipeline order. Each node is counted
 * once, under the first stage that rejected it (as Kubernetes and Nomad do),
 * so the counts of one explanation add up to the fleet size.
 */
export const REJECT_REASONS = [
  "lost",
  "unreachable",
  "cordoned",
  "draining",
  "gpu-model",
  "gpu-size",
  "gpu-memory",
  "gpu-free",
  "ports",
  "fabric-label",
  "fabric-group",
] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

export interface Rejection {
  reason: RejectReason;
  count: number;
  /** Up to a few node names, for the operator to look at. */
  nodes: string[];
  /** Human phrase with its count, e.g. "2 have fewer than 8 free GPUs of >=80 GiB". */
  message: string;
}

export interface Explanation {
  /** `<model>/<profile>` */
  target: string;
  replicaId?: string;
  /** What one replica needs, in words. */
  requirement: string;
  nodesTotal: number;
  /** Nodes that passed every stage. */
  nodesFeasible: number;
  rejected: Rejection[];
  placed?: Assignment;
  /** For an unplaceable replica: the closest the fleet came. */
  bestPartial?: { nodes: string[]; detail: string };
  /** Set when no placement was tried (e.g. backoff); the stages were not the reason. */
  note?: string;
  /** What ended the replica's (or the model's) last run: what an operator reads first when it will not start. */
  lastFailure?: { summary: string; tail: string[] };
}

export type PlacementResult =
  | { ok: true; assignment: Assignment; explanation: Explanation }
  | { ok: false; explanation: Explanation };
