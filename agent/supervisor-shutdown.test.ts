import { rmSync } from "node:fs";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { ShardState, type ShardStatus, StartShardSchema } from "../proto/gen/agent/v1/agent_pb.ts";
import { processRunning, tempDir } from "../test/harness/fleet.ts";
import { freePort, REPO, waitUntil } from "../test/harness/process.ts";
import { readStateFile, STATE_FILE_NAME } from "./state-file.ts";
import { Supervisor } from "./supervisor.ts";

const FAKE = join(REPO, "test/bin/fake-engine.mjs");
const quiet = { debug() {}, info() {}, warn() {}, error() {}, child: () => undefined as never };

async function spec(replicaId: string, env: Record<string, string> = {}) {
  return create(StartShardSchema, {
    replicaId,
    engine: "vllm",
    model: "fake/shutdown-model",
    servedModelName: "fake",
    worldNodes: 1,
    gpuIndices: [0],
    tensorParallel: 1,
    pipelineParallel: 1,
    dataParallel: 1,
    ports: { http: await freePort() },
    startupDeadlineMs: 60_000,
    stopGraceMs: 1_000,
    generation: 1n,
    env,
  });
}

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function open(dir: string, events: ShardStatus[]) {
  const sup = await Supervisor.open({
    stateDir: dir,
    node: { advertiseAddress: "127.0.0.1" },
    bins: { vllm: FAKE },
    onStatus: (s, kind) => kind === "transition" && events.push(s),
    restart: { baseMs: 60_000 },
    healthIntervalMs: 50,
    livenessIntervalMs: 100_000,
    logger: quiet,
  });
  cleanups.push(() => sup.stopAll("test over"));
  return sup;
}

describe("Supervisor.shutdown (agent --stop-engines-on-exit)", () => {
  it("stops every engine — ready, loading, waiting out a restart, one being started — and leaves nothing to adopt", async () => {
    const dir = tempDir("sup-shutdown");
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const events: ShardStatus[] = [];
    const sup = await open(dir, events);
    const seen = (id: string, state: ShardState) => () =>
      events.find((e) => e.replicaId === id && e.state === state);

    await sup.start(await spec("ready"));
    await waitUntil("ready", seen("ready", ShardState.READY));
    await sup.start(await spec("loading", { FAKE_NEVER_READY: "1" }));
    await sup.start(await spec("crashed", { FAKE_EXIT_AFTER_MS: "100", FAKE_EXIT_CODE: "3" }));
    const failed = await waitUntil("crashed fails", seen("crashed", ShardState.FAILED_RUNNING));
    expect(failed.restartAtUnixMs).toBeGreaterThan(0n);
    const late = sup.start(await spec("late"));

    await sup.shutdown("agent exiting");
    await late;

    const pids = events.map((e) => e.pid).filter((p) => p > 0);
    expect(pids.length).toBeGreaterThanOrEqual(3);
    expect(pids.filter(processRunning)).toEqual([]);
    for (const id of ["ready", "loading", "crashed", "late"]) {
      expect(events.findLast((e) => e.replicaId === id)).toMatchObject({
        state: ShardState.STOPPED,
        reason: "agent exiting",
      });
    }
    expect(readStateFile(join(dir, STATE_FILE_NAME)).records).toEqual([]);

    const next = await open(dir, []);
    expect(next.list()).toEqual([]);
  });
});
