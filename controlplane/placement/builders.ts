/**
 * Builders for placement snapshots and catalog profiles, shared by the unit
 * tests and the placement benchmark. Profiles go through the real config
 * schema and catalog, so the tests exercise the same derived numbers the
 * control plane uses.
 */
import { buildCatalog, type CatalogProfile } from "../catalog.ts";
import { configSchema } from "../config/schema.ts";
import type { NodeState, PlacementNode } from "./types.ts";

export interface NodeSpec {
  gpus?: number;
  gpuName?: string;
  memGiB?: number;
  /** MiB used by foreign processes, per GPU index. */
  foreignMiB?: Record<number, number>;
  state?: NodeState;
  cordoned?: boolean;
  draining?: boolean;
  drainDeadline?: number;
  fabric?: Record<string, string>;
  allocated?: number[];
  usedPorts?: number[];
}

export function gpuNode(name: string, spec: NodeSpec = {}): PlacementNode {
  const count = spec.gpus ?? 8;
  const total = (spec.memGiB ?? 80) * 1024;
  return {
    name,
    state: spec.state ?? "ready",
    cordoned: spec.cordoned ?? false,
    draining: spec.draining ?? false,
    ...(spec.drainDeadline !== undefined ? { drainDeadline: spec.drainDeadline } : {}),
    fabric: spec.fabric ?? {},
    gpus: Array.from({ length: count }, (_, index) => ({
      index,
      name: spec.gpuName ?? "NVIDIA H100 80GB HBM3",
      memoryTotalMiB: total,
      memoryFreeMiB: total - (spec.foreignMiB?.[index] ?? 0),
    })),
    allocatedGpus: new Set(spec.allocated ?? []),
    usedPorts: new Set(spec.usedPorts ?? []),
  };
}

/** Profiles of one model from plain config objects (snake_case, as in YAML). */
export function profilesOf(model: Record<string, unknown>): CatalogProfile[] {
  const config = configSchema.parse({ models: [model] });
  return buildCatalog(config).models[0]!.profiles.slice();
}

export function profileOf(model: string, profile: Record<string, unknown>): CatalogProfile {
  return profilesOf({ name: model, profiles: [{ engine: "vllm", source: `org/${model}`, ...profile }] })[0]!;
}

export const PORTS = { first: 20000, last: 20999 };
