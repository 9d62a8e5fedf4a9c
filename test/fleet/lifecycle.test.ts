import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

// Shortened lifecycle so the test sees every transition in seconds; the
// defaults (15 s / 60 s) are the same code with other numbers.
const CONFIG = `
control:
  unreachable_after: 2s
  lost_after: 5s
  startup_grace: 1s
  heartbeat_interval: 300ms
`;

const FABRICS: Record<string, Record<string, string>> = {
  "gpu-a": { ib: "island-1", rack: "r1" },
  "gpu-b": { ib: "island-1", rack: "r2" },
  "gpu-c": { ib: "island-2" },
};

describe("agents, the stream and node lifecycle (real processes)", () => {
  let cp: ControlPlaneHandle;
  const agents: Record<string, Proc> = {};

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    for (const [name, fabric] of Object.entries(FABRICS)) {
      agents[name] = startAgent(cp, name, {
        fabric,
        gpus: name === "gpu-c" ? "4xA100-40GB" : "8xH100-80GB",
        extra: ["--stable-after", "1s", "--ping-interval", "1s", "--ping-timeout", "1s"],
      });
    }
  });

  afterAll(async () => {
    await Promise.all(Object.values(agents).map((a) => a.kill()));
    await cp?.proc.kill();
  });

  it("registers every agent with its inventory and fabric labels, as ctl nodes --json shows", async () => {
    await waitUntil(
      "three ready nodes",
      async () => (await cp.nodes()).filter((n) => n.state === "ready").length === 3,
    );
    const out = await cp.ctl("nodes", "--json");
    expect(out.code).toBe(0);
    const nodes = JSON.parse(out.stdout) as Array<Record<string, unknown>>;
    expect(nodes.map((n) => n.name)).toEqual(["gpu-a", "gpu-b", "gpu-c"]);
    for (const n of nodes) {
      expect(n.state).toBe("ready");
      expect(n.fabric).toEqual(FABRICS[n.name as string]);
      expect(Number.isNaN(Date.parse(n.lastSeen as string))).toBe(false);
    }
    const a = nodes[0] as { gpus: Array<Record<string, unknown>> };
    expect(a.gpus).toHaveLength(8);
    expect(a.gpus[3]).toMatchObject({
      index: 3,
      name: "NVIDIA H100 80GB (simulated)",
      memoryTotalMiB: 81920,
    });
    expect(typeof a.gpus[3]!.uuid).toBe("string");
    const c = nodes[2] as { gpus: Array<Record<string, unknown>> };
    expect(c.gpus).toHaveLength(4);
    expect(c.gpus[0]).toMatchObject({ memoryTotalMiB: 40960, memoryFreeMiB: 40960 });

    const table = await cp.ctl("nodes");
    expect(table.stdout).toMatch(
      /gpu-a\s+ready\s+\S+\s+8×H100 80GB \(simulated\), 640 GiB free\s+ib=island-1,rack=r1/,
    );
  });

  it("kill -9 of an agent: unreachable, then lost, at the configured times; back to ready on restart", async () => {
    agents["gpu-b"]!.child.kill("SIGKILL");
    await agents["gpu-b"]!.exited;
    const unreachable = await waitUntil(
      "gpu-b unreachable",
      async () => (await cp.nodes()).find((n) => n.name === "gpu-b" && n.state === "unreachable"),
      10_000,
    );
    const lastSeen = Date.parse(unreachable.lastSeen);
    // The control plane's own clock: unreachable at unreachable_after, not
    // before, and not only at lost_after (how close to it each tick lands is
    // controlplane/registry.test.ts's, on a clock of its own).
    const toUnreachable = Date.parse(unreachable.since) - lastSeen;
    expect(toUnreachable).toBeGreaterThanOrEqual(2_000);
    expect(toUnreachable).toBeLessThan(5_000);
    const lost = await waitUntil(
      "gpu-b lost",
      async () => (await cp.nodes()).find((n) => n.name === "gpu-b" && n.state === "lost"),
      15_000,
    );
    const toLost = Date.parse(lost.since) - lastSeen;
    expect(toLost).toBeGreaterThanOrEqual(5_000);
    // The others never wavered.
    for (const n of await cp.nodes()) if (n.name !== "gpu-b") expect(n.state).toBe("ready");

    agents["gpu-b"] = startAgent(cp, "gpu-b", { fabric: FABRICS["gpu-b"]!, extra: ["--stable-after", "1s"] });
    const back = await waitUntil(
      "gpu-b ready again",
      async () => (await cp.nodes()).find((n) => n.name === "gpu-b" && n.state === "ready"),
      15_000,
    );
    expect(back.fabric).toEqual(FABRICS["gpu-b"]);
    expect(back.gpus).toHaveLength(8);
  });

  it("kill -9 of the control plane: every agent is back within its backoff window, none restarted", async () => {
    const before = new Map((await cp.nodes()).map((n) => [n.name, n.agentInstance]));
    const pids = Object.fromEntries(Object.entries(agents).map(([k, p]) => [k, p.child.pid]));
    // Every session stable (--stable-after 1s since it registered), so the backoff starts from its base.
    await waitUntil(
      "every session stable",
      async () => (await cp.nodes()).every((n) => Date.now() - Date.parse(n.registeredAt) > 1_000),
      5_000,
      50,
    );
    const mark = Object.fromEntries(Object.entries(agents).map(([k, p]) => [k, p.output().length]));
    cp.proc.child.kill("SIGKILL");
    await cp.proc.exited;
    await cp.restart();
    const nodes = await waitUntil(
      "all agents re-registered",
      async () => {
        const n = await cp.nodes();
        return n.length === 3 && n.every((x) => x.state === "ready" && x.connected) ? n : undefined;
      },
      20_000,
      50,
    );
    for (const n of nodes) {
      // Same agent process: the instance id is minted once per process start.
      expect(n.agentInstance).toBe(before.get(n.name));
      expect(n.fabric).toEqual(FABRICS[n.name]);
    }
    for (const [name, p] of Object.entries(agents)) {
      expect(p.child.exitCode).toBeNull();
      expect(p.child.pid).toBe(pids[name]);
    }
    // Each agent waited out only its own backoff windows: after a stable
    // session they start at 1 s and double (full jitter inside each) up to
    // the 5 s period (agent/reconnect-schedule.ts), and the attempt that
    // succeeded came right after the last wait.
    // The records are what is checked here. The control plane lists a node
    // connected once it has taken its Register; the agent writes its record
    // when the answer arrives, which can reach this process's pipe later.
    for (const [name, p] of Object.entries(agents)) {
      const records = () =>
        p
          .output()
          .slice(mark[name])
          .split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l) as { time: string; msg: string; inMs?: number; attempt?: number });
      const lines = await waitUntil(
        `${name}'s re-registration recorded`,
        () => {
          const r = records();
          return r.some((l) => l.msg === "registered with control plane") ? r : undefined;
        },
        10_000,
        20,
      );
      const waits = lines.filter((l) => l.msg === "reconnecting");
      const registered = lines.find((l) => l.msg === "registered with control plane");
      expect(registered, `${name} re-registered`).toBeDefined();
      expect(waits.length).toBeGreaterThan(0);
      waits.forEach((w, i) => {
        expect(w.attempt).toBe(i + 1);
        expect(w.inMs!).toBeLessThanOrEqual(Math.min(1_000 * 2 ** i, 5_000));
      });
      const last = waits.at(-1)!;
      const tookMs = Date.parse(registered!.time) - Date.parse(last.time);
      expect(tookMs).toBeGreaterThanOrEqual(last.inMs! - 5);
    }
  });
});
