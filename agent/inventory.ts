import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { cpus, hostname, totalmem } from "node:os";
import { promisify } from "node:util";
import type { GpuInfo, NodeInventory } from "../common/inventory.ts";
import type { ShardState } from "../common/shard-state.ts";
import {
  APPS_QUERY,
  CSV_FORMAT,
  GPU_QUERY,
  mergeInventory,
  parseAppsCsv,
  parseGpuCsv,
} from "./nvidia-smi.ts";

const run = promisify(execFile);

/**
 * `8xH100-80GB`, or several groups: `4xH100-80GB,4xA100-40GB`. Lets any
 * machine play a GPU node, which is how the local stack and the tests run.
 */
export interface SimulatedGpuGroup {
  count: number;
  model: string;
  memoryGiB: number;
}

const SPEC = /^(\d+)x([A-Za-z0-9]+(?:[A-Za-z0-9_]*))-(\d+)GB$/;

export function parseSimulateSpec(spec: string): SimulatedGpuGroup[] {
  const groups = spec.split(",").map((s) => s.trim());
  return groups.map((g) => {
    const m = SPEC.exec(g);
    if (!m) throw new Error(`--simulate-gpus: "${g}" is not COUNTxMODEL-MEMGB (e.g. 8xH100-80GB)`);
    const count = Number(m[1]);
    if (count < 1 || count > 64) throw new Error(`--simulate-gpus: count in "${g}" must be 1..64`);
    return { count, model: m[2]!, memoryGiB: Number(m[3]) };
  });
}

/** An engine as the simulated inventory sees it: where it runs, how much it reserves, whether it has loaded. */
export interface SimulatedEngine {
  state: ShardState;
  gpuIndices: readonly number[];
  /** The spec's share of each card; 0 means the engine's own default. */
  gpuMemoryUtilization: number;
}

/** vLLM's --gpu-memory-utilization when none is given (SGLang's static fraction is near it). */
const ENGINE_DEFAULT_UTILIZATION = 0.9;

/**
 * MiB each GPU's engines hold, as nvidia-smi shows a real vLLM: once loaded
 * it reserves its share of the card's *total* memory (weights plus the KV
 * cache it preallocates), and holds it until it exits, draining included.
 * An engine still starting is left out; a real one grows while it loads.
 */
export function memoryHeldByEngines(
  engines: readonly SimulatedEngine[],
  totalMiB: ReadonlyMap<number, number>,
): Map<number, number> {
  const held = new Map<number, number>();
  for (const e of engines) {
    if (e.state !== "ready" && e.state !== "draining") continue;
    const share = e.gpuMemoryUtilization > 0 ? e.gpuMemoryUtilization : ENGINE_DEFAULT_UTILIZATION;
    for (const i of e.gpuIndices) {
      const total = totalMiB.get(i);
      if (total !== undefined) held.set(i, Math.min(total, (held.get(i) ?? 0) + Math.floor(share * total)));
    }
  }
  return held;
}

export function simulatedGpus(
  node: string,
  groups: SimulatedGpuGroup[],
  foreignMiB: Map<number, number> = new Map(),
  engineMiB: ReadonlyMap<number, number> = new Map(),
): GpuInfo[] {
  const out: GpuInfo[] = [];
  for (const g of groups) {
    for (let i = 0; i < g.count; i++) {
      const index = out.length;
      const hex = createHash("sha256").update(`${node}/${index}`).digest("hex");
      const total = g.memoryGiB * 1024;
      const foreign = foreignMiB.get(index) ?? 0;
      const used = Math.min(total, foreign + (engineMiB.get(index) ?? 0));
      out.push({
        index,
        uuid: `GPU-${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`,
        name: `NVIDIA ${g.model} ${g.memoryGiB}GB (simulated)`,
        memoryTotalMiB: total,
        memoryUsedMiB: used,
        memoryFreeMiB: total - used,
        pciBusId: `00000000:${(0x18 + index * 0x10).toString(16).toUpperCase().padStart(2, "0")}:00.0`,
        driverVersion: "simulated",
        computeCapability: "9.0",
        foreign: foreign > 0 ? [{ pid: 0, usedMiB: foreign }] : [],
      });
    }
  }
  return out;
}

export interface InventorySource {
  collect(ownPids?: ReadonlySet<number>): Promise<{ inventory: NodeInventory; problems: string[] }>;
}

function hostFacts() {
  return { cpuCores: cpus().length, ramTotalMiB: Math.round(totalmem() / 1048576), hostname: hostname() };
}

/** Simulated GPUs whose memory in use is the foreign VRAM given plus what the agent's engines hold. */
export function simulatedInventory(
  node: string,
  spec: string,
  foreign: Map<number, number>,
  engines: () => readonly SimulatedEngine[],
): InventorySource {
  const groups = parseSimulateSpec(spec);
  const totals = new Map(simulatedGpus(node, groups).map((g) => [g.index, g.memoryTotalMiB]));
  return {
    async collect() {
      const gpus = simulatedGpus(node, groups, foreign, memoryHeldByEngines(engines(), totals));
      return { inventory: { gpus, ...hostFacts(), simulated: true }, problems: [] };
    },
  };
}

export function nvidiaSmiInventory(binary = "nvidia-smi"): InventorySource {
  return {
    async collect(ownPids) {
      const problems: string[] = [];
      let gpuText = "";
      try {
        gpuText = (await run(binary, [GPU_QUERY, CSV_FORMAT], { timeout: 10_000 })).stdout;
      } catch (err) {
        problems.push(`nvidia-smi failed: ${(err as Error).message.split("\n")[0]}`);
      }
      let appsText = "";
      try {
        appsText = (await run(binary, [APPS_QUERY, CSV_FORMAT], { timeout: 10_000 })).stdout;
      } catch (err) {
        problems.push(`nvidia-smi compute-apps failed: ${(err as Error).message.split("\n")[0]}`);
      }
      const gpus = parseGpuCsv(gpuText);
      const apps = parseAppsCsv(appsText);
      problems.push(...gpus.problems, ...apps.problems.map((p) => `compute-apps ${p}`));
      return {
        inventory: {
          gpus: mergeInventory(gpus.items, apps.items, ownPids),
          ...hostFacts(),
          simulated: false,
        },
        problems,
      };
    },
  };
}
