/**
 * Parsers for nvidia-smi's CSV output. Pure, so captured outputs (kept as
 * fixtures) are the test: drivers print `[N/A]`, `[Not Supported]`, or
 * "No devices were found" where you would expect numbers, and one odd line
 * must not hide the other GPUs.
 */
import type { GpuInfo } from "../common/inventory.ts";

export const GPU_QUERY =
  "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap";
export const APPS_QUERY = "--query-compute-apps=pid,gpu_uuid,used_gpu_memory";
export const CSV_FORMAT = "--format=csv,noheader,nounits";

export interface ParseResult<T> {
  items: T[];
  /** One entry per line that could not be used, with the reason. */
  problems: string[];
}

function cells(line: string): string[] {
  return line.split(",").map((c) => c.trim());
}

function isUnavailable(v: string): boolean {
  return /^\[.*\]$/.test(v) || v === "N/A" || v === "";
}

function mib(v: string): number | undefined {
  if (isUnavailable(v)) return undefined;
  if (!/^\d+$/.test(v)) return Number.NaN;
  return Number(v);
}

export function parseGpuCsv(text: string): ParseResult<Omit<GpuInfo, "foreign">> {
  const items: Omit<GpuInfo, "foreign">[] = [];
  const problems: string[] = [];
  const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
  for (const [i, line] of lines.entries()) {
    if (/no devices were found/i.test(line)) continue;
    const c = cells(line);
    if (c.length !== 9) {
      problems.push(`line ${i + 1}: expected 9 fields, got ${c.length}`);
      continue;
    }
    const [index, uuid, name, pci, total, used, free, driver, cc] = c as [
      string,
      string,
      string,
      string,
      string,
      string,
      string,
      string,
      string,
    ];
    const idx = Number(index);
    const totalMiB = mib(total);
    if (!/^\d+$/.test(index) || !uuid || totalMiB === undefined || Number.isNaN(totalMiB)) {
      problems.push(`line ${i + 1}: unusable index, uuid or memory.total`);
      continue;
    }
    const usedMiB = mib(used);
    const freeMiB = mib(free);
    if (Number.isNaN(usedMiB) || Number.isNaN(freeMiB)) {
      problems.push(`line ${i + 1}: memory.used/memory.free are not numbers`);
      continue;
    }
    // Some drivers (vGPU, MIG parents) report used/free as [N/A]; treating
    // the GPU as empty would over-commit it, as fully used would hide it, so
    // assume empty but say so.
    if (usedMiB === undefined || freeMiB === undefined) {
      problems.push(`line ${i + 1}: memory.used/free unavailable, assuming the GPU is empty`);
    }
    items.push({
      index: idx,
      uuid,
      name,
      pciBusId: pci,
      memoryTotalMiB: totalMiB,
      memoryUsedMiB: usedMiB ?? 0,
      memoryFreeMiB: freeMiB ?? totalMiB - (usedMiB ?? 0),
      driverVersion: isUnavailable(driver) ? "" : driver,
      computeCapability: isUnavailable(cc) ? "" : cc,
    });
  }
  return { items, problems };
}

export interface ComputeApp {
  pid: number;
  gpuUuid: string;
  usedMiB: number;
}

export function parseAppsCsv(text: string): ParseResult<ComputeApp> {
  const items: ComputeApp[] = [];
  const problems: string[] = [];
  const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
  for (const [i, line] of lines.entries()) {
    if (/no running processes found/i.test(line)) continue;
    const c = cells(line);
    if (c.length !== 3 || !/^\d+$/.test(c[0]!) || !c[1]) {
      problems.push(`line ${i + 1}: expected pid, gpu_uuid, used_gpu_memory`);
      continue;
    }
    const used = mib(c[2]!);
    if (used === undefined || Number.isNaN(used)) {
      problems.push(`line ${i + 1}: used_gpu_memory unavailable for pid ${c[0]}`);
      continue;
    }
    items.push({ pid: Number(c[0]), gpuUuid: c[1]!, usedMiB: used });
  }
  return { items, problems };
}

/**
 * Attaches foreign VRAM users to their GPUs. `ownPids` are the engines this
 * agent started: their memory is ours, not foreign.
 */
export function mergeInventory(
  gpus: Omit<GpuInfo, "foreign">[],
  apps: ComputeApp[],
  ownPids: ReadonlySet<number> = new Set(),
): GpuInfo[] {
  return gpus.map((g) => ({
    ...g,
    foreign: apps
      .filter((a) => a.gpuUuid === g.uuid && !ownPids.has(a.pid))
      .map((a) => ({ pid: a.pid, usedMiB: a.usedMiB })),
  }));
}
