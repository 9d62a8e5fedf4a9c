/** What a node has, as its agent reports it and the control plane keeps it. */
export interface GpuInfo {
  index: number;
  uuid: string;
  name: string;
  memoryTotalMiB: number;
  memoryFreeMiB: number;
  memoryUsedMiB: number;
  pciBusId: string;
  driverVersion: string;
  computeCapability: string;
  /** VRAM held by processes llmgw did not start: not free for placement. */
  foreign: { pid: number; usedMiB: number }[];
}

export interface NodeInventory {
  gpus: GpuInfo[];
  cpuCores: number;
  ramTotalMiB: number;
  hostname: string;
  simulated: boolean;
}
