import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import type { ReplicaJson } from "../../cli/ctl/replicas.ts";
import { type ControlPlaneHandle, processRunning, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * A node declared lost whose engines kept running, and that comes back
 * (docs/operating.md, "A node that comes back"): its agent is SIGSTOPped past
 * `lost_after` — the engines, separate processes, serve on — and then let go.
 * What happens to its engine depends on what the control plane did meanwhile:
 * nothing placed in its stead → adopted; a replacement that serves → the
 * replacement stays and the returning copy stops; a replacement still loading
 * → the returning engine is the replica again and the replacement stops.
 */
const CONFIG = `
control:
  interval: 1s
  unreachable_after: 1s
  lost_after: 3s
  startup_grace: 1s
  heartbeat_interval: 300ms
models:
  - name: tiny
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/lost-return
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 2 }
        startup_deadline: 120s
        spread: true
`;

const shardsOf = (rs: readonly ReplicaJson[]) =>
  rs.flatMap((r) => r.shards.map((s) => ({ id: r.id, node: s.node, state: s.state, pid: s.pid })));

describe("a node back after it was declared lost (real processes)", () => {
  let cp: ControlPlaneHandle;
  const agents = new Map<string, Proc>();
  const extra = ["--vllm-bin", "test/bin/vllm", "--stable-after", "1s"];
  const addNode = (node: string) => agents.set(node, startAgent(cp, node, { gpus: "1xH100-80GB", extra }));

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    addNode("n1");
    addNode("n2");
  }, 60_000);

  afterAll(async () => {
    for (const a of agents.values()) a.child.kill("SIGCONT");
    await Promise.all([...agents.values()].map((a) => a.kill()));
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  /** The shards of `want` replicas, when exactly that many exist and each is ready with its engine's PID. */
  async function readyShards(want: number) {
    const rs = await cp.replicas();
    const ready = rs.filter((r) => r.state === "ready" && r.shards.every((s) => s.pid));
    return ready.length === want && rs.length === want ? shardsOf(ready) : undefined;
  }
  const settled = (want: number) =>
    waitUntil(`${want} replicas ready with PIDs`, () => readyShards(want), 90_000);

  /** SIGSTOPs `node`'s agent until the control plane has declared the node lost. */
  async function loseNode(node: string): Promise<void> {
    agents.get(node)!.child.kill("SIGSTOP");
    await waitUntil(
      `${node} lost`,
      async () => (await cp.nodes()).find((n) => n.name === node)?.state === "lost",
      30_000,
    );
  }

  const comeBack = (node: string) => agents.get(node)!.child.kill("SIGCONT");

  it("nothing placed in its stead: its engine is adopted, the same process", async () => {
    const before = await settled(2);
    const away = before.find((s) => s.node === "n2")!;
    await loseNode("n2");
    // The slot is released and waits: n1's one GPU is taken, n2 is lost.
    await waitUntil("the lost node's replica released", async () =>
      (await cp.replicas()).some((r) => r.id === away.id && r.shards.length === 0),
    );
    expect(processRunning(away.pid!)).toBe(true);
    comeBack("n2");
    const after = await settled(2);
    expect(after).toEqual(before);
    expect(processRunning(away.pid!)).toBe(true);
    const nodes = await cp.nodes();
    expect(nodes.find((n) => n.name === "n2")).toMatchObject({ state: "ready", connected: true });
  }, 120_000);

  it("a replacement that serves is kept; the returning copy stops", async () => {
    addNode("n3");
    await waitUntil(
      "n3 ready",
      async () => (await cp.nodes()).find((n) => n.name === "n3")?.state === "ready",
    );
    const before = await settled(2);
    const away = before.find((s) => s.node === "n2")!;
    await loseNode("n2");
    const replaced = await waitUntil(
      "a replacement ready on n3",
      async () => (await readyShards(2))?.find((s) => s.id === away.id && s.node === "n3"),
      90_000,
    );
    comeBack("n2");
    await waitUntil(
      "n2 back",
      async () => (await cp.nodes()).find((n) => n.name === "n2")?.state === "ready",
      30_000,
    );
    await waitUntil("the returning engine stopped", () => !processRunning(away.pid!), 60_000);
    const after = await settled(2);
    expect(after.find((s) => s.id === away.id)).toEqual(replaced);
    expect(after.filter((s) => s.node === "n2")).toEqual([]);
  }, 240_000);

  it("a replacement still loading stops; the returning engine is the replica again", async () => {
    // From now on a new engine takes a minute to load, as a large model's
    // weights would; the rollout is paused, so the running ones are not
    // replaced for it (docs/placement.md, "Rollouts").
    const text = readFileSync(cp.configPath, "utf8");
    writeFileSync(
      cp.configPath,
      text.replace(
        '"--sim-speed", "50"]',
        '"--sim-speed", "50", "--sim-startup-seconds", "60"]\n        rollout: { paused: true }',
      ),
    );
    cp.proc.child.kill("SIGHUP");
    const before = await settled(2);
    const away = before.find((s) => s.node === "n3")!;
    await loseNode("n3");
    const loading = await waitUntil(
      "a replacement loading on n2",
      async () =>
        shardsOf(await cp.replicas()).find((s) => s.id === away.id && s.node === "n2" && s.pid !== null),
      60_000,
    );
    expect(loading.state).toBe("starting");
    comeBack("n3");
    await waitUntil("the replacement stopped", () => !processRunning(loading.pid!), 60_000);
    const after = await settled(2);
    expect(after).toEqual(before);
    expect(processRunning(away.pid!)).toBe(true);
  }, 240_000);
});
