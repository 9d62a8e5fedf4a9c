/**
 * From what the registry knows about a node to what placement reads. The
 * one subtle rule: a GPU's usable memory is its total minus what *foreign*
 * processes (not started by llmgw) hold. Memory our own engines hold is
 * accounted by GPU allocation in the replica table, so counting it here too
 * would make a node look full twice over.
 */
import type { GpuInfo } from "../../common/inventory.ts";
import type { NodeState, PlacementNode } from "./types.ts";

export interface NodeFacts {
  name: string;
  state: NodeState;
  fabric: Readonly<Record<string, string>>;
  inventory: { gpus: readonly Pick<GpuInfo, "index" | "name" | "memoryTotalMiB" | "foreign">[] };
}

export interface NodeIntent {
  cordoned?: boolean;
  draining?: boolean;
  drainDeadline?: number;
}

export function placementNode(facts: NodeFacts, intent: NodeIntent = {}): PlacementNode {
  return {
    name: facts.name,
    state: facts.state,
    cordoned: intent.cordoned ?? false,
    draining: intent.draining ?? false,
    ...(intent.drainDeadline !== undefined ? { drainDeadline: intent.drainDeadline } : {}),
    fabric: facts.fabric,
    gpus: facts.inventory.gpus.map((g) => ({
      index: g.index,
      name: g.name,
      memoryTotalMiB: g.memoryTotalMiB,
      memoryFreeMiB: Math.max(0, g.memoryTotalMiB - g.foreign.reduce((s, f) => s + f.usedMiB, 0)),
    })),
    allocatedGpus: new Set(),
    usedPorts: new Set(),
  };
}
