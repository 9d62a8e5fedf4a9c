import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { memoryHeldByEngines, parseSimulateSpec, simulatedGpus, simulatedInventory } from "./inventory.ts";
import { mergeInventory, parseAppsCsv, parseGpuCsv } from "./nvidia-smi.ts";

const fixture = (name: string) =>
  readFileSync(join(import.meta.dirname, "../test/fixtures/nvidia-smi", name), "utf8");

describe("nvidia-smi parsing", () => {
  it("reads eight H100s and attributes foreign VRAM to the right GPU", () => {
    const gpus = parseGpuCsv(fixture("h100x8.csv"));
    expect(gpus.problems).toEqual([]);
    expect(gpus.items).toHaveLength(8);
    expect(gpus.items[2]).toMatchObject({
      index: 2,
      name: "NVIDIA H100 80GB HBM3",
      memoryTotalMiB: 81559,
      memoryUsedMiB: 12283,
      memoryFreeMiB: 68725,
      pciBusId: "00000000:3A:00.0",
      driverVersion: "550.90.07",
      computeCapability: "9.0",
    });
    const apps = parseAppsCsv(fixture("h100x8-apps.csv"));
    const merged = mergeInventory(gpus.items, apps.items);
    expect(merged[2]!.foreign).toEqual([{ pid: 48213, usedMiB: 12270 }]);
    expect(merged.filter((g) => g.foreign.length > 0)).toHaveLength(1);
    // An engine of our own is not foreign.
    expect(mergeInventory(gpus.items, apps.items, new Set([48213]))[2]!.foreign).toEqual([]);
  });

  it("keeps a GPU whose memory use is not reported, and says so", () => {
    const r = parseGpuCsv(fixture("a10g-not-supported.csv"));
    expect(r.items).toHaveLength(1);
    expect(r.items[0]).toMatchObject({ memoryTotalMiB: 23028, memoryFreeMiB: 23028, memoryUsedMiB: 0 });
    expect(r.problems[0]).toMatch(/unavailable/);
  });

  it("treats 'No devices were found' as an empty node", () => {
    expect(parseGpuCsv(fixture("no-devices.txt"))).toEqual({ items: [], problems: [] });
    expect(parseAppsCsv(fixture("apps-none.csv"))).toEqual({ items: [], problems: [] });
  });

  it("reports malformed lines without throwing", () => {
    const r = parseGpuCsv(fixture("malformed.csv"));
    expect(r.items).toEqual([]);
    expect(r.problems).toHaveLength(2);
    const a = parseAppsCsv(fixture("apps-malformed.csv"));
    expect(a.items).toEqual([]);
    expect(a.problems).toHaveLength(2);
  });
});

describe("--simulate-gpus", () => {
  it("parses groups and builds stable GPUs", () => {
    expect(parseSimulateSpec("8xH100-80GB")).toEqual([{ count: 8, model: "H100", memoryGiB: 80 }]);
    const gpus = simulatedGpus("n1", parseSimulateSpec("2xH100-80GB,2xA100-40GB"), new Map([[1, 1000]]));
    expect(gpus.map((g) => g.name)).toEqual([
      "NVIDIA H100 80GB (simulated)",
      "NVIDIA H100 80GB (simulated)",
      "NVIDIA A100 40GB (simulated)",
      "NVIDIA A100 40GB (simulated)",
    ]);
    expect(gpus[1]).toMatchObject({
      memoryTotalMiB: 81920,
      memoryFreeMiB: 80920,
      foreign: [{ usedMiB: 1000 }],
    });
    expect(simulatedGpus("n1", parseSimulateSpec("1xH100-80GB"))[0]!.uuid).toBe(gpus[0]!.uuid);
  });

  it("rejects malformed specs with the flag's name", () => {
    expect(() => parseSimulateSpec("eightxH100")).toThrow(/--simulate-gpus/);
    expect(() => parseSimulateSpec("0xH100-80GB")).toThrow(/1..64/);
  });
});

describe("simulated GPU memory held by the agent's engines", () => {
  const totals = new Map([
    [0, 81920],
    [1, 81920],
    [2, 40960],
  ]);
  it.each([
    { name: "none running", engines: [], held: {} },
    {
      name: "a loaded engine holds its share of the card",
      engines: [{ state: "ready", gpuIndices: [0], gpuMemoryUtilization: 0.5 }],
      held: { 0: 40960 },
    },
    {
      name: "no utilization given is vLLM's 0.9, on every GPU of a TP engine",
      engines: [{ state: "draining", gpuIndices: [1, 2], gpuMemoryUtilization: 0 }],
      held: { 1: 73728, 2: 36864 },
    },
    {
      name: "starting, stopped and failed engines hold nothing",
      engines: [
        { state: "starting", gpuIndices: [0], gpuMemoryUtilization: 0.9 },
        { state: "stopped", gpuIndices: [1], gpuMemoryUtilization: 0.9 },
        { state: "failed_running", gpuIndices: [2], gpuMemoryUtilization: 0.9 },
      ],
      held: {},
    },
    {
      name: "never more than the card, nor on a GPU the node lacks",
      engines: [
        { state: "ready", gpuIndices: [0, 7], gpuMemoryUtilization: 0.9 },
        { state: "ready", gpuIndices: [0], gpuMemoryUtilization: 0.9 },
      ],
      held: { 0: 81920 },
    },
  ] as const)("$name", ({ engines, held }) => {
    expect(Object.fromEntries(memoryHeldByEngines(engines, totals))).toEqual(held);
  });

  it("the inventory shows it as used, beside foreign memory, on each collect", async () => {
    let engines: { state: "ready" | "stopped"; gpuIndices: number[]; gpuMemoryUtilization: number }[] = [];
    const source = simulatedInventory("n1", "2xH100-80GB", new Map([[1, 1000]]), () => engines);
    const used = async () =>
      (await source.collect()).inventory.gpus.map((g) => [g.memoryUsedMiB, g.memoryFreeMiB]);
    expect(await used()).toEqual([
      [0, 81920],
      [1000, 80920],
    ]);
    engines = [{ state: "ready", gpuIndices: [1], gpuMemoryUtilization: 0.9 }];
    expect(await used()).toEqual([
      [0, 81920],
      [1000 + 73728, 81920 - 1000 - 73728],
    ]);
  });
});
