import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

const CONFIG = `
control:
  interval: 1s
  startup_grace: 1s
  heartbeat_interval: 300ms
`;
const MODELS = `
models:
  - name: tiny
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/tiny
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 1 }
        startup_deadline: 60s
        stop_grace: 5s
`;

type Replica = { id: string; state: string; shards: { node: string; pid: number | null }[] };

describe("drain (real processes)", () => {
  let cp: ControlPlaneHandle;
  const agents: Proc[] = [];

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    const extra = ["--vllm-bin", "test/bin/vllm"];
    agents.push(startAgent(cp, "d1", { gpus: "1xH100-80GB", extra }));
    agents.push(startAgent(cp, "d2", { gpus: "1xH100-80GB", extra }));
    await waitUntil(
      "two nodes",
      async () => (await cp.nodes()).filter((n) => n.state === "ready").length === 2,
    );
    const { appendFileSync } = await import("node:fs");
    appendFileSync(cp.configPath, MODELS);
    cp.proc.child.kill("SIGHUP");
  });

  afterAll(async () => {
    await Promise.all(agents.map((a) => a.kill()));
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  const replicas = async () => (await cp.replicas()) as Replica[];

  it("places the replacement elsewhere first, then drains the node; the drain survives a restart", async () => {
    const first = await waitUntil("tiny ready", async () => {
      const r = (await replicas())[0];
      return r?.state === "ready" && r.shards[0]?.pid ? r : undefined;
    });
    const from = first.shards[0]!.node;
    const to = from === "d1" ? "d2" : "d1";
    const oldPid = first.shards[0]!.pid!;

    const out = await cp.ctl("drain", from, "--deadline", "2m");
    expect(out.stdout).toContain(`${from}: draining`);
    const moved = await waitUntil(
      "tiny ready on the other node",
      async () => {
        const r = (await replicas())[0];
        return r?.state === "ready" && r.shards.length === 1 && r.shards[0]!.node === to ? r : undefined;
      },
      45_000,
      250,
    );
    expect(moved.shards[0]!.pid).not.toBe(oldPid);
    // The old engine was drained and stopped, not left behind.
    await waitUntil(
      "the old engine gone",
      () => {
        try {
          process.kill(oldPid, 0);
          return false;
        } catch {
          return true;
        }
      },
      30_000,
    );
    // The replacement was placed while the old replica still served, and the
    // old one was stopped only once the replacement was ready.
    const passes = cp.proc
      .output()
      .split("\n")
      .filter((l) => l.includes("reconcile pass"));
    const placedAt = passes.findIndex(
      (l) => /place tiny\/1gpu\/\d+/.test(l) && !l.includes(`place ${first.id}:`),
    );
    const stoppedAt = passes.findIndex((l) =>
      /stop tiny\/1gpu\/\d+: node \w+ draining; 1 replacement\(s\) ready elsewhere/.test(l),
    );
    expect(placedAt).toBeGreaterThanOrEqual(0);
    expect(stoppedAt).toBeGreaterThan(placedAt);
    const node = (await cp.nodes()).find((n) => n.name === from)!;
    expect(node).toMatchObject({ draining: true, cordoned: true });

    // Operator intent is in SQLite: a restarted control plane still knows.
    cp.proc.child.kill("SIGKILL");
    await cp.proc.exited;
    await cp.restart();
    await waitUntil("the node back", async () => (await cp.nodes()).some((n) => n.name === from));
    expect((await cp.nodes()).find((n) => n.name === from)).toMatchObject({ draining: true });
    await cp.ctl("uncordon", from);
    expect((await cp.nodes()).find((n) => n.name === from)).toMatchObject({
      draining: false,
      cordoned: false,
    });
  });
});
