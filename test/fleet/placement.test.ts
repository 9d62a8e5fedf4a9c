import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

// Two 8-GPU nodes on fabric A, one on fabric B. A 2-node model (tensor
// parallel 8 × pipeline parallel 2) must land on A; the 1-GPU model's three
// replicas bin-pack onto what is left, which is B.
//
// The control plane starts with no models; once all three agents have
// registered, the models are added to the file and SIGHUP reloads it, so
// placement sees the whole fleet however slowly the agents start.
// lost_freeze_fraction is raised because this test kills two of three
// nodes on purpose; at the default (half) the control plane would rightly
// refuse to call them lost.
const CONTROL = `
control:
  interval: 1s
  unreachable_after: 2s
  lost_after: 4s
  startup_grace: 1s
  heartbeat_interval: 300ms
  lost_freeze_fraction: 0.8
`;
const MODELS = `
models:
  - name: big
    profiles:
      - name: tp8pp2
        engine: vllm
        source: meta-llama/Llama-3.1-70B-Instruct
        tensor_parallel: 8
        pipeline_parallel: 2
        nodes: 2
        fabric: ib
        gpu: { model: H100, min_memory_gib: 80 }
        engine_args: ["--max-model-len", "8192", "--sim-speed", "20"]
        startup_deadline: 60s
  - name: small
    profiles:
      - name: 1gpu
        engine: vllm
        source: meta-llama/Llama-3.1-8B-Instruct
        engine_args: ["--max-model-len", "8192", "--sim-speed", "20"]
        replicas: { min: 3 }
        startup_deadline: 60s
`;

type ReplicaJson = {
  id: string;
  model: string;
  state: string;
  shards: { rank: number; node: string; gpus: number[]; ports: { http: number; distInit: number[] } }[];
};

describe("placement, the reconciler and explain (real processes)", () => {
  let cp: ControlPlaneHandle;
  const agents: Record<string, Proc> = {};

  beforeAll(async () => {
    cp = await startControlPlane(CONTROL);
    const extra = ["--vllm-bin", "test/bin/vllm", "--stable-after", "1s"];
    agents.a1 = startAgent(cp, "a1", { fabric: { ib: "fabric-a" }, extra });
    agents.a2 = startAgent(cp, "a2", { fabric: { ib: "fabric-a" }, extra });
    agents.b1 = startAgent(cp, "b1", { fabric: { ib: "fabric-b" }, extra });
  });

  afterAll(async () => {
    await Promise.all(Object.values(agents).map((a) => a.kill()));
    await cp?.proc.kill();
    killEngines(join(cp.dir, "agents"));
  });

  async function replicas(): Promise<ReplicaJson[]> {
    return cp.replicas();
  }

  it("places the 2-node model on one fabric and the 1-GPU replicas on what is left; every agent starts its shards", async () => {
    await waitUntil(
      "three nodes ready",
      async () => (await cp.nodes()).filter((n) => n.state === "ready").length === 3,
    );
    expect(await replicas()).toEqual([]);
    appendFileSync(cp.configPath, MODELS);
    cp.proc.child.kill("SIGHUP");
    const ready = await waitUntil(
      "all four replicas ready",
      async () => {
        const list = await replicas();
        return list.length === 4 && list.every((r) => r.state === "ready") ? list : undefined;
      },
      45_000,
      250,
    );
    const big = ready.find((r) => r.model === "big")!;
    expect(big.shards.map((s) => [s.rank, s.node]).sort()).toEqual([
      [0, expect.stringMatching(/^a[12]$/)],
      [1, expect.stringMatching(/^a[12]$/)],
    ]);
    expect(new Set(big.shards.map((s) => s.node)).size).toBe(2);
    for (const s of big.shards) expect(s.gpus).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    // Rank 0 carries the rendezvous port the other rank dials.
    const rank0 = big.shards.find((s) => s.rank === 0)!;
    expect(rank0.ports.distInit.length).toBeGreaterThan(0);

    const small = ready.filter((r) => r.model === "small");
    expect(small).toHaveLength(3);
    for (const r of small) expect(r.shards).toEqual([expect.objectContaining({ node: "b1" })]);
    expect(new Set(small.map((r) => r.shards[0]!.gpus[0])).size).toBe(3);
    const ports = small.map((r) => r.shards[0]!.ports.http);
    expect(new Set(ports).size).toBe(3);
    for (const p of ports) {
      expect(p).toBeGreaterThanOrEqual(cp.enginePorts[0]);
      expect(p).toBeLessThanOrEqual(cp.enginePorts[1]);
    }

    // Each agent received its StartShard, launched an engine and reported it ready.
    for (const r of ready)
      for (const s of r.shards)
        expect(s, `${r.id} rank ${s.rank}`).toMatchObject({ state: "ready", pid: expect.any(Number) });

    const explain = await cp.ctl("explain", "big");
    expect(explain.stdout).toMatch(/big\/tp8pp2\/0 placed: /);
  });

  it("kill the fabric-A agents: once their nodes are lost, explain says why the 2-node model cannot run", async () => {
    for (const n of ["a1", "a2"]) {
      agents[n]!.child.kill("SIGKILL");
      await agents[n]!.exited;
    }
    await waitUntil(
      "a1 and a2 lost",
      async () => (await cp.nodes()).filter((n) => n.state === "lost").length === 2,
      20_000,
    );
    const text = await waitUntil(
      "explain to give up on big",
      async () => {
        const text = (await cp.client.explain({ model: "big" })).lines.join("\n");
        // Until the reconciler drops the lost placement, explain shows it beside the new verdict.
        return /0\/3 nodes can host big\/tp8pp2/.test(text) && !/ placed: /.test(text) ? text : undefined;
      },
      20_000,
      250,
    );
    expect(text).toMatch(/2 lost/);
    expect((await cp.ctl("explain", "big")).stdout).toBe(`${text}\n`);
    // The one node left has 5 of its 8 GPUs free after the small replicas.
    expect(text).toMatch(/1 ha(s|ve) fewer than 8 free GPUs/);
    const json = JSON.parse((await cp.ctl("explain", "big", "--json")).stdout) as {
      nodesTotal: number;
      nodesFeasible: number;
      rejected: { reason: string; count: number }[];
    }[];
    expect(json[0]).toMatchObject({ nodesTotal: 3, nodesFeasible: 0 });
    expect(json[0]!.rejected).toEqual(
      expect.arrayContaining([expect.objectContaining({ reason: "lost", count: 2 })]),
    );
    // The small model was never disturbed.
    const small = (await replicas()).filter((r) => r.model === "small");
    expect(small.every((r) => r.state === "ready")).toBe(true);
  });

  it("a control plane restart adopts running shards (same PIDs) and keeps operator intent (SQLite)", async () => {
    const pidsBefore = new Map(
      (await replicasWithPids()).filter((r) => r.model === "small").map((r) => [r.id, r.shards[0]!.pid]),
    );
    expect([...pidsBefore.values()].every((p) => typeof p === "number" && p > 0)).toBe(true);
    expect((await cp.ctl("cordon", "b1")).stdout).toContain("b1: cordoned");
    cp.proc.child.kill("SIGKILL");
    await cp.proc.exited;
    await cp.restart();
    const after = await waitUntil(
      "small replicas adopted",
      async () => {
        const list = (await replicasWithPids()).filter((r) => r.model === "small");
        // Ready from the start (the fleet kept in llmgw.db); adopted once each agent reported its engine.
        return list.length === 3 && list.every((r) => r.state === "ready" && r.shards[0]!.pid)
          ? list
          : undefined;
      },
      30_000,
      250,
    );
    for (const r of after) {
      expect(r.shards[0]!.pid).toBe(pidsBefore.get(r.id));
      expect(r.restarts).toBe(0);
    }
    const b1 = (await cp.nodes()).find((n) => n.name === "b1")!;
    expect(b1.cordoned).toBe(true);
    expect((await cp.ctl("nodes")).stdout).toMatch(/b1 \(cordoned\)/);
    await cp.ctl("uncordon", "b1");
    expect((await cp.nodes()).find((n) => n.name === "b1")!.cordoned).toBe(false);
  });

  async function replicasWithPids() {
    return cp.replicas();
  }
});
