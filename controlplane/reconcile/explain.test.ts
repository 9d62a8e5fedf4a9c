import { describe, expect, it } from "vitest";
import { gpuNode } from "../../test/fixtures/placement.ts";
import { buildCatalog } from "../catalog.ts";
import { configSchema } from "../config/schema.ts";
import { formatExplanations } from "../placement/explain.ts";
import { placementNode } from "../placement/snapshot.ts";
import { explainModel } from "./explain.ts";
import { plan, planSettings } from "./plan.ts";
import { ReplicaTable } from "./table.ts";

const config = configSchema.parse({
  models: [
    {
      name: "llama-70b",
      profiles: [
        {
          name: "tp8",
          engine: "vllm",
          source: "m/70b",
          tensor_parallel: 8,
          gpu: { min_memory_gib: 80 },
          replicas: { min: 2 },
        },
      ],
    },
    { name: "coder" },
  ],
  endpoints: [{ id: "c1", url: "http://10.0.0.9:8000", models: ["coder"] }],
});
const catalog = buildCatalog(config);
const settings = planSettings(config.control);

describe("explainModel", () => {
  it("explains a placed replica and an unplaceable one, as lines and JSON", () => {
    const nodes = [gpuNode("g1"), gpuNode("g2", { cordoned: true }), gpuNode("g3", { memGiB: 40 })];
    const table = new ReplicaTable();
    table.apply(plan(table.planState(catalog, nodes, settings), 0), 0);
    const list = explainModel(table.planState(catalog, nodes, settings), "llama-70b", 1)!;
    expect(list.map((e) => e.replicaId)).toEqual(["llama-70b/tp8/0", "llama-70b/tp8/1"]);
    const { lines, json } = formatExplanations(list);
    expect(lines[0]).toBe("llama-70b/tp8/0 placed: rank 0 on g1 GPU 0-7 port 20000");
    expect(lines[1]).toBe("  why: bin-pack: leaves 0 of 8 GPUs free on g1 (score 1.00)");
    expect(lines[2]).toBe("  status: starting, generation 1, 0 restart(s)");
    expect(lines[3]).toBe(
      "llama-70b/tp8/1: 0/3 nodes can host llama-70b/tp8: 1 cordoned, 1 has fewer than 8 GPUs of >=80 GiB, 1 has fewer than 8 free GPUs of >=80 GiB",
    );
    expect(lines).toContain("  needs: 8 GPUs (>=80 GiB, 90% VRAM free) and 1 port on one node");
    const parsed = JSON.parse(json) as { rejected: { reason: string; count: number }[] }[];
    expect(parsed[1]!.rejected).toEqual([
      expect.objectContaining({ reason: "cordoned", count: 1, nodes: ["g2"] }),
      expect.objectContaining({ reason: "gpu-size", count: 1, nodes: ["g3"] }),
      expect.objectContaining({ reason: "gpu-free", count: 1, nodes: ["g1"] }),
    ]);
  });

  it("shows a replica's last failure with the end of its engine's output", () => {
    const nodes = [gpuNode("g1"), gpuNode("g2")];
    const table = new ReplicaTable();
    table.apply(plan(table.planState(catalog, nodes, settings), 0), 0);
    const tail = Array.from({ length: 20 }, (_, i) => `line ${i}`);
    tail.push("ModuleNotFoundError: No module named 'vllm'");
    table.observe(
      "g1",
      {
        replicaId: "llama-70b/tp8/0",
        rank: 0,
        generation: 1,
        state: "failed_startup",
        failure: { reason: "exited with code 1 during startup", exitCode: 1, outputTail: tail, at: 1_000 },
      },
      1_000,
    );
    const list = explainModel(table.planState(catalog, nodes, settings), "llama-70b", 61_000)!;
    const { lines } = formatExplanations(list.filter((e) => e.replicaId === "llama-70b/tp8/0"));
    const at = lines.indexOf("  last failure: exited with code 1 during startup, 1m ago");
    expect(at).toBeGreaterThan(0);
    // The last twelve lines, the error among them.
    expect(lines.slice(at + 1)).toEqual([
      ...tail.slice(-12).map((l) => `    | ${l}`),
      ...lines.slice(at + 13),
    ]);
    expect(lines).toContain("    | ModuleNotFoundError: No module named 'vllm'");
    expect(lines).not.toContain("    | line 8");
  });

  it("explains router-only models and unknown ones", () => {
    const state = new ReplicaTable().planState(catalog, [], settings);
    expect(explainModel(state, "coder", 0)![0]!.note).toBe("router-only: served by static endpoints c1");
    expect(explainModel(state, "nope", 0)).toBeUndefined();
  });
});

describe("placementNode", () => {
  it("subtracts foreign VRAM users, not llmgw's own", () => {
    const n = placementNode(
      {
        name: "g1",
        state: "ready",
        fabric: { ib: "a" },
        inventory: {
          gpus: [{ index: 0, name: "H100", memoryTotalMiB: 81920, foreign: [{ pid: 7, usedMiB: 2048 }] }],
        },
      },
      { cordoned: true },
    );
    expect(n.gpus[0]!.memoryFreeMiB).toBe(79872);
    expect(n.cordoned).toBe(true);
    expect(n.draining).toBe(false);
  });
});
