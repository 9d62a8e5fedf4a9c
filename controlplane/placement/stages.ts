/**
 * The stages of placement, each a small pure function that either passes a
 * node or names the reason it rejects it. The pipeline (pipeline.ts) runs
 * them in this order and counts rejections per reason, which is all the
 * explain output needs. Order matters: a node is blamed on the first stage
 * that rejects it, so cheap and operator-facing reasons (lost, cordoned) come
 * before hardware reasons.
 */
import type { NodeView } from "./fleet.ts";
import { hasRoom, type PortNeeds, portNeeds, portsPerNode } from "./ports.ts";
import type { PlacementProfile, PortRange, RejectReason } from "./types.ts";

/** A profile with the numbers every stage needs precomputed once per placement. */
export interface Requirements {
  profile: PlacementProfile;
  gpusPerNode: number;
  nodes: number;
  gpuModelLower: string | undefined;
  minMemoryMiB: number;
  memoryFraction: number;
  ports: PortNeeds;
  /** Ports a node needs free to host any rank. */
  portsPerNode: number;
  /** Contiguous block a node needs for the most demanding rank. */
  portBlock: number;
  portRange: PortRange;
}

export function requirements(profile: PlacementProfile, portRange: PortRange): Requirements {
  const ports = portNeeds(profile);
  return {
    profile,
    gpusPerNode: profile.gpusPerNode,
    nodes: profile.nodes,
    gpuModelLower: profile.gpuModel?.toLowerCase(),
    minMemoryMiB: profile.minMemoryMiB,
    memoryFraction: profile.memoryFraction,
    ports,
    portsPerNode: portsPerNode(ports),
    portBlock: Math.max(ports.rank0Block, ports.otherBlock),
    portRange,
  };
}

// --- node stages: no GPU inspection needed ---------------------------------

/** Only ready nodes take new shards; unreachable ones keep theirs but get nothing new. */
export function nodeStateStage(view: NodeView): RejectReason | undefined {
  const s = view.node.state;
  return s === "ready" ? undefined : s;
}

/** Cordon and drain are operator intents: nothing new lands on either. */
export function schedulableStage(view: NodeView): RejectReason | undefined {
  if (view.node.cordoned) return "cordoned";
  if (view.node.draining) return "draining";
  return undefined;
}

// --- GPU stages ---------------------------------------------------------------

/**
 * One pass over a node's GPUs, narrowing at each step: matching model →
 * big enough → enough VRAM free of foreign processes → not allocated to
 * another shard. The counts feed one stage each.
 */
export interface GpuTally {
  matchingModel: number;
  bigEnough: number;
  memoryOk: number;
  /** Indices usable now, lowest first. */
  free: number[];
}

export function tallyGpus(view: NodeView, req: Requirements): GpuTally {
  let matchingModel = 0;
  let bigEnough = 0;
  let memoryOk = 0;
  const free: number[] = [];
  for (const g of view.node.gpus) {
    if (req.gpuModelLower !== undefined && !g.name.toLowerCase().includes(req.gpuModelLower)) continue;
    matchingModel++;
    if (g.memoryTotalMiB < req.minMemoryMiB) continue;
    bigEnough++;
    // vLLM claims gpu_memory_utilization × *total* VRAM at start and refuses
    // to start when foreign processes leave less than that free.
    if (g.memoryFreeMiB < req.memoryFraction * g.memoryTotalMiB) continue;
    memoryOk++;
    if (!view.isAllocated(g.index)) free.push(g.index);
  }
  // Inventories list GPUs in index order; sort only when one does not.
  for (let i = 1; i < free.length; i++) {
    if (free[i]! < free[i - 1]!) {
      free.sort((a, b) => a - b);
      break;
    }
  }
  return { matchingModel, bigEnough, memoryOk, free };
}

export function gpuModelStage(_v: NodeView, req: Requirements, t: GpuTally): RejectReason | undefined {
  return req.gpuModelLower !== undefined && t.matchingModel === 0 ? "gpu-model" : undefined;
}

export function gpuSizeStage(_v: NodeView, req: Requirements, t: GpuTally): RejectReason | undefined {
  return t.bigEnough < req.gpusPerNode ? "gpu-size" : undefined;
}

export function gpuMemoryStage(_v: NodeView, req: Requirements, t: GpuTally): RejectReason | undefined {
  return t.memoryOk < req.gpusPerNode ? "gpu-memory" : undefined;
}

export function gpuFreeStage(_v: NodeView, req: Requirements, t: GpuTally): RejectReason | undefined {
  return t.free.length < req.gpusPerNode ? "gpu-free" : undefined;
}

export const GPU_STAGES = [gpuModelStage, gpuSizeStage, gpuMemoryStage, gpuFreeStage] as const;

// --- ports --------------------------------------------------------------------

export function portStage(view: NodeView, req: Requirements): RejectReason | undefined {
  return hasRoom(view.ports, view.usedInRange, req.portRange, req.portBlock) ? undefined : "ports";
}

// --- rank ---------------------------------------------------------------------

/**
 * Bin-pack (default) prefers the node left with the fewest unallocated GPUs,
 * keeping whole nodes free for the big multi-GPU replicas that need them;
 * spread prefers the emptiest node. Both subtract a replica anti-affinity
 * penalty (Nomad's job-anti-affinity: shards of the same profile already on
 * the node / desired replicas), so the three replicas of one small model do
 * not all die with one node while different models still pack together.
 */
export function scoreNode(view: NodeView, req: Requirements): number {
  const total = view.node.gpus.length || 1;
  const freeAfter = view.unallocatedCount - req.gpusPerNode;
  const fit = req.profile.strategy === "spread" ? freeAfter / total : 1 - freeAfter / total;
  const collisions = view.shardsOf(req.profile.key);
  return fit - collisions / Math.max(1, req.profile.replicas.min);
}

interface ShapeCache {
  /** Set when every GPU of the node is the same kind: the common case, answered without looking. */
  uniform: string | undefined;
  byIndex: Map<number, string>;
}

// Keyed by the snapshot's node object, so the cache lives as long as the
// snapshot does (often many passes) and never outlives it.
const shapes = new WeakMap<object, ShapeCache>();

function shapeCache(view: NodeView): ShapeCache {
  let c = shapes.get(view.node);
  if (!c) {
    const byIndex = new Map<number, string>();
    for (const g of view.node.gpus)
      byIndex.set(g.index, `${g.name}/${Math.round(g.memoryTotalMiB / 1024)}GiB`);
    const kinds = new Set(byIndex.values());
    c = { uniform: kinds.size === 1 ? [...kinds][0] : undefined, byIndex };
    shapes.set(view.node, c);
  }
  return c;
}

/** GPU shape of the GPUs a rank would get: ranks of one replica must match. */
export function gpuShape(view: NodeView, gpus: readonly number[]): string {
  const c = shapeCache(view);
  if (c.uniform !== undefined) return c.uniform;
  const kinds = new Set<string>();
  for (const i of gpus) {
    const k = c.byIndex.get(i);
    if (k) kinds.add(k);
  }
  return [...kinds].sort().join("+");
}
