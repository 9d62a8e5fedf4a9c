import { describe, expect, it } from "vitest";
import { gpuNode, PORTS, profileOf } from "./builders.ts";
import { formatExplanation } from "./explain.ts";
import { Fleet } from "./fleet.ts";
import { PlacementSession, placeReplica } from "./pipeline.ts";
import type { PlacementNode, PlacementResult, RejectReason } from "./types.ts";

function counts(r: PlacementResult): Partial<Record<RejectReason, number>> {
  return Object.fromEntries(r.explanation.rejected.map((x) => [x.reason, x.count]));
}

function place(nodes: PlacementNode[], profile: ReturnType<typeof profileOf>, range = PORTS) {
  return placeReplica(new Fleet(nodes, range), profile, { replicaId: `${profile.key}/0` });
}

const small = profileOf("llama-8b", { name: "1gpu" });
const tp8 = profileOf("llama-70b", { name: "tp8", tensor_parallel: 8, gpu: { min_memory_gib: 80 } });
const tp8pp2 = profileOf("llama-70b", {
  name: "tp8",
  tensor_parallel: 8,
  pipeline_parallel: 2,
  nodes: 2,
  fabric: "ib",
  gpu: { min_memory_gib: 80 },
});

describe("ranking", () => {
  const nodes = () => [
    gpuNode("a", { allocated: [0, 1, 2, 3, 4, 5] }), // 2 free
    gpuNode("b"), // 8 free
    gpuNode("c", { allocated: [0, 1, 2, 3] }), // 4 free
  ];

  it("bin-packs onto the node left with the fewest free GPUs", () => {
    const r = place(nodes(), small);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.assignment.shards).toEqual([
      { rank: 0, node: "a", gpus: [6], ports: { http: 20000, distInit: [] } },
    ]);
    expect(r.explanation.nodesFeasible).toBe(3);
    expect(r.explanation.rejected).toEqual([]);
    expect(r.assignment.why).toBe("bin-pack: leaves 1 of 8 GPUs free on a");
  });

  it("spreads onto the emptiest node when the profile asks for it", () => {
    const spread = profileOf("llama-8b", { name: "1gpu", spread: true });
    const r = place(nodes(), spread);
    expect(r.ok && r.assignment.shards[0]!.node).toBe("b");
    expect(r.explanation.nodesFeasible).toBe(3);
  });

  it("keeps replicas of one profile apart while packing, and never reuses GPUs or ports", () => {
    const three = profileOf("llama-8b", { name: "1gpu", replicas: { min: 3 } });
    const fleet = new Fleet([gpuNode("a"), gpuNode("b"), gpuNode("c")], PORTS);
    const placed: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = placeReplica(fleet, three);
      if (!r.ok) throw new Error("unplaceable");
      fleet.reserve(three.key, r.assignment);
      placed.push(r.assignment.shards[0]!.node);
    }
    expect(new Set(placed).size).toBe(3);
    // A fourth lands next to one of them, on different GPUs and ports.
    const r = placeReplica(fleet, three);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    const s = r.assignment.shards[0]!;
    expect(s.gpus).toEqual([1]);
    expect(s.ports.http).toBe(20001);
  });
});

describe("tensor parallel over 8 GPUs", () => {
  it("takes all eight GPUs of one node and no dist-init port", () => {
    const r = place([gpuNode("full", { allocated: [7] }), gpuNode("empty")], tp8);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.assignment.shards).toEqual([
      { rank: 0, node: "empty", gpus: [0, 1, 2, 3, 4, 5, 6, 7], ports: { http: 20000, distInit: [] } },
    ]);
    expect(counts(r)).toEqual({ "gpu-free": 1 });
    expect(r.explanation.nodesFeasible).toBe(1);
    expect(formatExplanation(r.explanation)[2]).toBe(
      "  1/2 nodes can host llama-70b/tp8: 1 has fewer than 8 free GPUs of >=80 GiB",
    );
  });

  it("refuses GPUs that are too small and says which", () => {
    const r = place([gpuNode("small", { memGiB: 40 }), gpuNode("model", { gpuName: "A100 80GB" })], {
      ...tp8,
      gpuModel: "H100",
    });
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ "gpu-model": 1, "gpu-size": 1 });
    expect(r.explanation.rejected.map((x) => x.message)).toEqual([
      "1 has no H100 GPUs",
      "1 has fewer than 8 GPUs of H100 >=80 GiB",
    ]);
  });
});

describe("pipeline parallel over 2 nodes", () => {
  it("places both ranks on nodes that share one fabric value", () => {
    const r = place(
      [
        gpuNode("a1", { fabric: { ib: "pod-a" } }),
        gpuNode("b1", { fabric: { ib: "pod-b" } }),
        gpuNode("a2", { fabric: { ib: "pod-a" } }),
      ],
      tp8pp2,
    );
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.assignment.fabric).toEqual({ key: "ib", value: "pod-a" });
    expect(r.assignment.shards.map((s) => [s.rank, s.node])).toEqual([
      [0, "a1"],
      [1, "a2"],
    ]);
    // vLLM multi-node: rank 0 binds the master port; rank 1 only dials it.
    expect(r.assignment.shards[0]!.ports).toEqual({ http: 20001, distInit: [20000] });
    expect(r.assignment.shards[1]!.ports).toEqual({ http: 20000, distInit: [] });
    expect(r.explanation.nodesFeasible).toBe(2);
    expect(counts(r)).toEqual({ "fabric-group": 1 });
  });

  it("data parallel over two nodes: rank 0 holds the RPC port and vLLM's band, and no master port", () => {
    const dp4 = profileOf("llama-70b", {
      name: "tp4dp4",
      tensor_parallel: 4,
      data_parallel: 4,
      nodes: 2,
      fabric: "ib",
    });
    const r = place(
      [gpuNode("a1", { fabric: { ib: "pod-a" } }), gpuNode("a2", { fabric: { ib: "pod-a" } })],
      dp4,
    );
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    const [rank0, rank1] = r.assignment.shards;
    expect(rank0!.ports.distInit).toEqual(Array.from({ length: 11 }, (_, i) => 20000 + i));
    expect(rank0!.ports.http).toBe(20011);
    expect(rank1!.ports).toEqual({ http: 20000, distInit: [] });
  });

  it("refuses to span two fabrics and names the closest group", () => {
    const r = place(
      [gpuNode("a1", { fabric: { ib: "pod-a" } }), gpuNode("b1", { fabric: { ib: "pod-b" } }), gpuNode("x")],
      tp8pp2,
    );
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ "fabric-label": 1, "fabric-group": 2 });
    expect(r.explanation.nodesFeasible).toBe(0);
    const lines = formatExplanation(r.explanation);
    expect(lines[0]).toBe(
      "llama-70b/tp8/0: 0/3 nodes can host llama-70b/tp8: 1 lacks fabric label ib, 2 are in ib groups with fewer than 2 eligible nodes of one GPU shape",
    );
    expect(r.explanation.bestPartial?.detail).toMatch(/^fabric ib=pod-a has 1 of 2 eligible nodes/);
  });

  it("needs identical GPU shape inside the fabric group", () => {
    const r = place(
      [
        gpuNode("a1", { fabric: { ib: "pod-a" } }),
        gpuNode("a2", { fabric: { ib: "pod-a" }, gpuName: "NVIDIA H200", memGiB: 141 }),
      ],
      tp8pp2,
    );
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ "fabric-group": 2 });
  });

  it("gives SGLang ranks one common dist-init block", () => {
    const sg = profileOf("qwen", {
      name: "tp16",
      engine: "sglang",
      tensor_parallel: 16,
      nodes: 2,
      fabric: "ib",
    });
    const r = place(
      [
        gpuNode("a", { fabric: { ib: "x" }, usedPorts: [20000, 20003] }),
        gpuNode("b", { fabric: { ib: "x" }, usedPorts: [20001] }),
      ],
      sg,
    );
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    const [s0, s1] = r.assignment.shards;
    expect(s0!.ports.distInit).toEqual(s1!.ports.distInit);
    expect(s0!.ports.distInit[0]).toBe(20004);
    expect(s0!.ports.distInit).toHaveLength(10);
  });
});

describe("memory after foreign VRAM use", () => {
  it("refuses a node whose GPUs other processes have partly filled", () => {
    const r = place([gpuNode("busy", { foreignMiB: { 3: 20 * 1024, 5: 9 * 1024 } })], tp8);
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ "gpu-memory": 1 });
    expect(r.explanation.rejected[0]!.message).toBe(
      "1 has fewer than 8 GPUs with 90% of VRAM free of other processes",
    );
    expect(r.explanation.bestPartial?.detail).toBe(
      "busy has 6 of 8 GPUs with enough VRAM free of other processes",
    );
  });

  it("accepts foreign use that leaves the engine its fraction", () => {
    const r = place([gpuNode("light", { foreignMiB: { 3: 4 * 1024 } })], tp8);
    expect(r.ok).toBe(true);
  });
});

describe("ports", () => {
  it("refuses a node whose range is used up", () => {
    const r = place([gpuNode("a", { usedPorts: [20000, 20001] }), gpuNode("b")], small, {
      first: 20000,
      last: 20001,
    });
    expect(r.ok && r.assignment.shards[0]!.node).toBe("b");
    expect(counts(r)).toEqual({ ports: 1 });
  });

  it("counts the master port a multi-node rank 0 needs", () => {
    const range = { first: 20000, last: 20001 };
    const r = place(
      [
        gpuNode("a", { fabric: { ib: "p" }, usedPorts: [20000] }),
        gpuNode("b", { fabric: { ib: "p" }, usedPorts: [20001] }),
      ],
      tp8pp2,
      range,
    );
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ ports: 2 });
    expect(r.explanation.rejected[0]!.message).toBe("2 have fewer than 2 free ports in 20000-20001");
  });

  it("exhausts the range over successive placements", () => {
    const fleet = new Fleet([gpuNode("a")], { first: 20000, last: 20002 });
    for (let i = 0; i < 3; i++) {
      const r = placeReplica(fleet, small);
      if (!r.ok) throw new Error(`replica ${i} unplaceable`);
      fleet.reserve(small.key, r.assignment);
    }
    const r = placeReplica(fleet, small);
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ ports: 1 });
  });
});

describe("node state and operator intent", () => {
  it("explains the design's six-node example, every node counted once", () => {
    const nodes = [
      gpuNode("n1", { state: "lost", fabric: { ib: "a" } }),
      gpuNode("n2", { state: "lost", fabric: { ib: "a" } }),
      gpuNode("n3", { cordoned: true, fabric: { ib: "a" } }),
      gpuNode("n4", { fabric: { ib: "a" }, allocated: [0, 1, 2, 3] }),
      gpuNode("n5", { fabric: { ib: "a" }, allocated: [4] }),
      gpuNode("n6"),
    ];
    const r = place(nodes, tp8pp2);
    expect(r.ok).toBe(false);
    expect(counts(r)).toEqual({ lost: 2, cordoned: 1, "gpu-free": 2, "fabric-label": 1 });
    const total = r.explanation.rejected.reduce((s, x) => s + x.count, 0);
    expect(total).toBe(6);
    expect(formatExplanation(r.explanation)[0]).toBe(
      "llama-70b/tp8/0: 0/6 nodes can host llama-70b/tp8: 2 lost, 1 cordoned, 2 have fewer than 8 free GPUs of >=80 GiB, 1 lacks fabric label ib",
    );
    expect(r.explanation.bestPartial?.detail).toBe("n5 has 7 of 8 GPUs free");
  });

  it("places nothing on draining or unreachable nodes", () => {
    const r = place(
      [
        gpuNode("d", { draining: true }),
        gpuNode("u", { state: "unreachable" }),
        gpuNode("ok", { allocated: [0] }),
      ],
      small,
    );
    expect(r.ok && r.assignment.shards[0]!.node).toBe("ok");
    expect(counts(r)).toEqual({ draining: 1, unreachable: 1 });
  });

  it("fast mode skips classification but finds the same node", () => {
    const nodes = [gpuNode("a", { allocated: [0, 1, 2, 3, 4, 5, 6, 7] }), gpuNode("b")];
    const r = placeReplica(new Fleet(nodes, PORTS), small, { explain: false });
    expect(r.ok && r.assignment.shards[0]!.node).toBe("b");
    expect(r.explanation.rejected).toEqual([]);
  });
});

describe("placement sessions", () => {
  // A small deterministic PRNG, so the fleet is "random" but the same every run.
  function rng(seed: number): () => number {
    let x = seed;
    return () => {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      return x / 2 ** 31;
    };
  }
  function randomFleet(seed: number): PlacementNode[] {
    const r = rng(seed);
    return Array.from({ length: 40 }, (_, i) => {
      const allocated = [0, 1, 2, 3, 4, 5, 6, 7].filter(() => r() < 0.4);
      return gpuNode(`n${String(i).padStart(2, "0")}`, {
        allocated,
        fabric: { ib: `p${i % 3}` },
        ...(r() < 0.1 ? { cordoned: true } : {}),
      });
    });
  }

  for (const [name, profile] of [
    ["tp2 ×30", profileOf("m", { name: "tp2", tensor_parallel: 2, replicas: { min: 30 } })],
    ["tp8pp2 ×4", { ...tp8pp2, replicas: { min: 4 } } as typeof tp8pp2],
  ] as const) {
    it(`picks exactly what repeated one-shot placement picks (${name})`, () => {
      const a = new Fleet(randomFleet(7), PORTS);
      const b = new Fleet(randomFleet(7), PORTS);
      const session = new PlacementSession(b, profile);
      for (let i = 0; i < 40; i++) {
        const one = placeReplica(a, profile, { explain: false });
        const two = session.place();
        expect(two?.shards).toEqual(one.ok ? one.assignment.shards : undefined);
        if (!one.ok) break;
        a.reserve(profile.key, one.assignment);
      }
    });
  }
});
