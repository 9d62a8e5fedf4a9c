import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readStateFile, STATE_FILE_NAME } from "../../agent/state-file.ts";
import {
  type ControlPlaneHandle,
  killProcessesMatching,
  processRunning,
  startAgent,
  startControlPlane,
} from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

// What a stopped engine means at the next start. An engine the agent stops
// on purpose (here: the agent exiting with --stop-engines-on-exit, as the
// local stack runs it) is not a crash; one that dies while no agent watches
// is. A tag unique to this run is part of the model source, so every engine
// this file started can be found in /proc and killed at the end.
const TAG = randomUUID().slice(0, 8);
const SOURCE = `sim-org/agent-exit-${TAG}`;
const REPLICA = "exit-demo/1gpu/0";

const CONFIG = `
control:
  interval: 1s
  startup_grace: 1s
models:
  - name: exit-demo
    profiles:
      - name: 1gpu
        engine: vllm
        source: ${SOURCE}
        engine_args: ["--max-model-len", "8192", "--sim-speed", "50"]
        startup_deadline: 45s
        stop_grace: 2s
`;

const BASE_EXTRA = ["--vllm-bin", "test/bin/vllm", "--restart-backoff", "30s"];

afterAll(() => {
  killProcessesMatching(SOURCE);
});

function records(cp: ControlPlaneHandle, node: string) {
  return readStateFile(join(cp.dir, "agents", node, STATE_FILE_NAME)).records;
}

async function readyReplica(cp: ControlPlaneHandle) {
  return waitUntil(
    `${REPLICA} ready`,
    async () => {
      const { replicas } = await cp.client.listReplicas({});
      const r = replicas.find((x) => x.id === REPLICA);
      return r?.state === "ready" && r.shards[0]?.pid ? r : undefined;
    },
    60_000,
    200,
  );
}

async function stop(p: Proc, signal: NodeJS.Signals): Promise<number | null> {
  p.child.kill(signal);
  return p.exited;
}

describe("an agent's engines at its next start", () => {
  it("stopped on purpose (--stop-engines-on-exit): gone with the agent, forgotten, not counted as a crash", async () => {
    const node = "exit-clean";
    const cp = await startControlPlane(CONFIG);
    const extra = [...BASE_EXTRA, "--stop-engines-on-exit"];
    let agent = startAgent(cp, node, { gpus: "1xH100-80GB", extra });
    try {
      const before = await readyReplica(cp);
      const pid = before.shards[0]!.pid;
      expect(records(cp, node).map((r) => r.pid)).toEqual([pid]);

      // Ctrl-C in the local stack: the agent and the control plane both get SIGINT.
      await Promise.all([stop(agent, "SIGINT"), stop(cp.proc, "SIGINT")]);
      expect(await agent.exited).toBe(0);
      expect(processRunning(pid)).toBe(false);
      expect(records(cp, node)).toEqual([]);

      await cp.restart();
      agent = startAgent(cp, node, { gpus: "1xH100-80GB", extra });
      const after = await readyReplica(cp);
      expect(after.shards[0]!.pid).not.toBe(pid);
      expect(after.restarts).toBe(0);
      expect(after.lastFailure).toBeUndefined();
      expect(records(cp, node).map((r) => [r.state, r.failures])).toEqual([["ready", 0]]);
    } finally {
      await agent.kill();
      await cp.proc.kill();
    }
  }, 150_000);

  it("died while its agent was down: still a crash, with the restart backoff", async () => {
    const node = "exit-crash";
    const cp = await startControlPlane(CONFIG);
    let agent = startAgent(cp, node, { gpus: "1xH100-80GB", extra: BASE_EXTRA });
    try {
      const pid = (await readyReplica(cp)).shards[0]!.pid;
      // An agent restart leaves the engine serving (the default); it dies meanwhile.
      expect(await stop(agent, "SIGTERM")).toBe(0);
      expect(processRunning(pid)).toBe(true);
      process.kill(-pid, "SIGKILL");
      await waitUntil("the engine gone", () => !processRunning(pid));

      agent = startAgent(cp, node, { gpus: "1xH100-80GB", extra: BASE_EXTRA });
      const failed = await waitUntil(
        "the crash reported to the control plane",
        async () => {
          const { replicas } = await cp.client.listReplicas({});
          return replicas.find((x) => x.id === REPLICA && x.lastFailure)?.lastFailure;
        },
        30_000,
        200,
      );
      expect(failed.reason).toMatch(/exited while the agent was down/);
      const [rec] = records(cp, node);
      expect(rec).toMatchObject({ replicaId: REPLICA, state: "failed_running", failures: 1 });
    } finally {
      await agent.kill();
      await cp.proc.kill();
    }
  }, 150_000);
});
