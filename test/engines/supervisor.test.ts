import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, type MessageInitShape, toJson, toJsonString } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { readStartTime } from "../../agent/engine-process.ts";
import type { ShardReport } from "../../agent/shard/record.ts";
import { readStateFile, STATE_FILE_NAME } from "../../agent/state-file.ts";
import { Supervisor, type SupervisorOptions } from "../../agent/supervisor.ts";
import type { ShardState } from "../../common/shard-state.ts";
import { type ShardLoad, type StartShard, StartShardSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { freePort, REPO, startProcess, waitUntil } from "../harness/process.ts";

const FAKE = join(REPO, "test/bin/fake-engine.mjs");
const SHIM = join(REPO, "test/bin/vllm");

type Init = MessageInitShape<typeof StartShardSchema>;

async function spec(over: Init = {}): Promise<StartShard> {
  return create(StartShardSchema, {
    replicaId: `r-${Math.random().toString(36).slice(2, 8)}`,
    engine: "vllm",
    model: "fake/model",
    servedModelName: "fake",
    worldNodes: 1,
    gpuIndices: [0],
    tensorParallel: 1,
    pipelineParallel: 1,
    dataParallel: 1,
    ports: { http: await freePort() },
    startupDeadlineMs: 10_000,
    stopGraceMs: 1_000,
    generation: 1n,
    ...over,
  } as Init);
}

interface Load {
  replicaId: string;
  load: ShardLoad;
}

interface Rig {
  sup: Supervisor;
  dir: string;
  events: ShardReport[];
  loads: Load[];
  open(extra?: Partial<SupervisorOptions>): Promise<Supervisor>;
  waitState(id: string, state: ShardState, timeoutMs?: number, after?: number): Promise<ShardReport>;
}

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return readStartTime(pid) !== null;
  } catch {
    return false;
  }
};

async function rig(
  extra: Partial<SupervisorOptions> = {},
  dir = mkdtempSync(join(tmpdir(), "llmgw-sup-")),
): Promise<Rig> {
  const events: ShardReport[] = [];
  const loads: Load[] = [];
  const open = async (more: Partial<SupervisorOptions> = {}) => {
    const sup = await Supervisor.open({
      stateDir: dir,
      node: { advertiseAddress: "127.0.0.1" },
      bins: { vllm: FAKE },
      onStatus: (s) => events.push(s),
      onLoad: (replicaId, _rank, load) => loads.push({ replicaId, load }),
      restart: { baseMs: 300, maxMs: 2_000, resetAfterMs: 60_000 },
      healthIntervalMs: 100,
      healthTimeoutMs: 500,
      livenessIntervalMs: 300,
      scrapeIntervalMs: 200,
      adoptPollMs: 100,
      drainPollMs: 100,
      drainSettleMs: 200,
      logger: { debug() {}, info() {}, warn() {}, error() {}, child: () => undefined as never },
      ...extra,
      ...more,
    });
    cleanups.push(() => sup.stopAll("test over"));
    return sup;
  };
  const sup = await open();
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return {
    sup,
    dir,
    events,
    loads,
    open,
    waitState: (id, state, timeoutMs = 10_000, after = 0) =>
      waitUntil(
        `${id} ${state}`,
        () => events.slice(after).find((e) => e.replicaId === id && e.state === state),
        timeoutMs,
        25,
      ),
  };
}

describe("Supervisor", () => {
  it("starts an engine through the vLLM adapter, reports ready and load, and stops it", async () => {
    const r = await rig();
    const s = await spec({ env: { FAKE_READY_AFTER_MS: "200" } });
    const started = await r.sup.start(s);
    expect(started.state).toBe("starting");
    const ready = await r.waitState(s.replicaId, "ready");
    expect(ready.pid).toBeGreaterThan(0);
    expect(ready.spec?.replicaId).toBe(s.replicaId);
    const log = readFileSync(join(r.dir, "logs", `${s.replicaId}.log`), "utf8");
    expect(log).toContain(
      `fake-engine pid ${ready.pid} argv: serve fake/model --host 127.0.0.1 --port ${s.ports?.http}`,
    );
    expect(log).toContain("CUDA_VISIBLE_DEVICES=0");
    const load = await waitUntil("a load report", () => r.loads.find((l) => l.load));
    expect(load.load).toMatchObject({ running: 0, waiting: 0, kvUsage: 0.25 });
    expect(r.sup.list().map((x) => x.state)).toEqual(["ready"]);
    await r.sup.stop(s.replicaId, "test stop");
    const stopped = await r.waitState(s.replicaId, "stopped");
    expect(stopped.reason).toBe("test stop");
    expect(alive(ready.pid)).toBe(false);
    expect(r.sup.list()).toEqual([]);
  });

  it("kill -9 of a ready engine: failed_running with exit code and tail, reported before the restart", async () => {
    const r = await rig();
    const s = await spec();
    await r.sup.start(s);
    const ready = await r.waitState(s.replicaId, "ready");
    process.kill(ready.pid, "SIGKILL");
    const failed = await r.waitState(s.replicaId, "failed_running");
    expect(failed.exitCode).toBe(137);
    expect(failed.reason).toMatch(/killed by SIGKILL \(exit code 137\); restart 1 in 0\.3s/);
    expect(failed.tail).toHaveLength(50);
    expect(failed.tail.at(-1)).toBe("fake-engine loading line 59");
    const failedAt = r.events.indexOf(failed);
    const again = await r.waitState(s.replicaId, "ready", 10_000, failedAt);
    expect(r.events.slice(failedAt).find((e) => e.state === "starting")).toBeDefined();
    expect(again.pid).not.toBe(ready.pid);
    expect(again.since - failed.since).toBeGreaterThanOrEqual(250);
    // What the agent's /metrics counts (llmgw_agent_engine_restarts_total).
    expect(r.sup.stats.restarts).toBe(1);
    // The previous run's log is kept beside the new one.
    expect(existsSync(join(r.dir, "logs", `${s.replicaId}.prev.log`))).toBe(true);
  });

  it("logs a failure once, however often the control plane's claim makes the agent report it again", async () => {
    const warnings: string[] = [];
    const logger = {
      debug() {},
      info() {},
      warn: (msg: string) => warnings.push(msg),
      error() {},
      child: () => undefined as never,
    };
    const r = await rig({ logger, restart: { baseMs: 30_000, maxMs: 60_000, resetAfterMs: 60_000 } });
    const s = await spec();
    await r.sup.start(s);
    const ready = await r.waitState(s.replicaId, "ready");
    process.kill(ready.pid, "SIGKILL");
    await r.waitState(s.replicaId, "failed_running");
    // Waiting out its restart backoff, the shard is claimed twice (the same generation again).
    await r.sup.start(s);
    await r.sup.start(s);
    expect(r.events.filter((e) => e.state === "failed_running")).toHaveLength(3);
    expect(warnings.filter((w) => w === "engine failed")).toEqual(["engine failed"]);
  });

  it("stop escalates SIGTERM to SIGKILL for the whole group of an engine that ignores SIGTERM", async () => {
    const r = await rig();
    const s = await spec({ env: { FAKE_IGNORE_SIGTERM: "1", FAKE_CHILD: "1" } });
    await r.sup.start(s);
    const ready = await r.waitState(s.replicaId, "ready");
    const log = () => readFileSync(join(r.dir, "logs", `${s.replicaId}.log`), "utf8");
    const childPid = Number(/child pid (\d+)/.exec(log())?.[1]);
    expect(alive(childPid)).toBe(true);
    // The forked worker counts as ours (its VRAM is not foreign).
    expect(r.sup.enginePids()).toEqual(new Set([ready.pid, childPid]));
    const t0 = Date.now();
    await r.sup.stop(s.replicaId, "test stop", 500);
    const took = Date.now() - t0;
    expect(took).toBeGreaterThanOrEqual(450);
    expect(log()).toContain("fake-engine ignoring SIGTERM");
    const stopped = await r.waitState(s.replicaId, "stopped");
    expect(stopped.exitCode).toBe(137);
    await waitUntil("group gone", () => !alive(ready.pid) && !alive(childPid), 2_000);
  });

  it("drains: reports draining, stops once nothing is in flight", async () => {
    const r = await rig();
    const loadFile = join(r.dir, "load.json");
    writeFileSync(loadFile, JSON.stringify({ running: 2, waiting: 1 }));
    const s = await spec({ env: { FAKE_LOAD_FILE: loadFile } });
    await r.sup.start(s);
    await r.waitState(s.replicaId, "ready");
    await r.sup.drain(s.replicaId, 10_000);
    const draining = await r.waitState(s.replicaId, "draining");
    expect(draining.reason).toBe("draining, deadline 10s");
    // Past the settle time the drain counts what is in flight: busy, so it stays.
    const counted = r.loads.length;
    await waitUntil("a busy count after the settle time", () =>
      r.loads
        .slice(counted)
        .find((l) => l.load.running === 2 && Number(l.load.scrapedAtUnixMs) - draining.since > 200),
    );
    expect(r.sup.get(s.replicaId)?.state).toBe("draining");
    writeFileSync(loadFile, JSON.stringify({ running: 0, waiting: 0 }));
    const stopped = await r.waitState(s.replicaId, "stopped");
    expect(stopped.reason).toBe("drained: no requests in flight");
  });

  it("refuses to launch into a busy port, with the reason", async () => {
    const r = await rig({ restart: { enabled: false } });
    const srv = createServer();
    const port = await freePort();
    await new Promise<void>((res) => srv.listen(port, "127.0.0.1", res));
    cleanups.push(() => new Promise<void>((res) => srv.close(() => res())));
    const s = await spec({ ports: { http: port } });
    const st = await r.sup.start(s);
    expect(st.state).toBe("failed_startup");
    expect(st.reason).toBe(
      `validation failed: port ${port} is already in use on this node; not restarting (agent restarts disabled)`,
    );
    expect(st.pid).toBe(0);
  });

  it("a new supervisor on the same state dir adopts the running engine (same PID), reports ready, and supervises it", async () => {
    const r = await rig();
    const s = await spec();
    await r.sup.start(s);
    const ready = await r.waitState(s.replicaId, "ready");
    r.sup.close();
    const state = JSON.parse(readFileSync(join(r.dir, "engines.json"), "utf8"));
    expect(state.shards[0]).toMatchObject({ replicaId: s.replicaId, pid: ready.pid, state: "ready" });
    expect(state.shards[0].startTime).toBe(readStartTime(ready.pid));

    const before = r.events.length;
    const sup2 = await r.open();
    const adopted = await r.waitState(s.replicaId, "ready", 5_000, before);
    expect(adopted.pid).toBe(ready.pid);
    expect(adopted.reason).toBe(`adopted pid ${ready.pid} after agent restart`);
    expect(sup2.list().map((x) => [x.replicaId, x.pid])).toEqual([[s.replicaId, ready.pid]]);
    // The control plane re-sends the same generation: a claim, not a restart.
    const claimed = await sup2.start(s);
    expect(claimed.pid).toBe(ready.pid);
    // An adopted engine is not our child: its death is noticed by polling.
    process.kill(ready.pid, "SIGKILL");
    const failed = await r.waitState(s.replicaId, "failed_running", 5_000, before);
    expect(failed.exitCode).toBeUndefined();
    expect(failed.reason).toMatch(/^exited \(exit code unknown: adopted engine\); restart 1 in/);
  });

  it("stops adopted engines nobody claims once the orphan grace has passed", async () => {
    const r = await rig();
    const keep = await spec();
    const orphan = await spec();
    await r.sup.start(keep);
    await r.sup.start(orphan);
    await r.waitState(keep.replicaId, "ready");
    const o = await r.waitState(orphan.replicaId, "ready");
    r.sup.close();
    const before = r.events.length;
    const sup2 = await r.open();
    await r.waitState(orphan.replicaId, "ready", 5_000, before);
    await sup2.start(keep);
    expect(sup2.stats).toMatchObject({ adopted: 2, orphanGrace: "not_begun", orphansStopped: 0 });
    sup2.beginOrphanGrace(300);
    expect(sup2.stats.orphanGrace).toBe("running");
    const stopped = await r.waitState(orphan.replicaId, "stopped", 5_000, before);
    expect(stopped.reason).toBe("orphan: not claimed by the control plane within 0.3s");
    expect(alive(o.pid)).toBe(false);
    expect(sup2.list().map((x) => [x.replicaId, x.state])).toEqual([[keep.replicaId, "ready"]]);
    // What the agent's /metrics shows (llmgw_agent_orphan_grace, _orphans_stopped_total).
    expect(sup2.stats).toMatchObject({ orphanGrace: "over", orphansStopped: 1 });
  });

  it("skips broken state file entries and adopts the rest", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-sup-"));
    writeFileSync(
      join(dir, "engines.json"),
      JSON.stringify({
        version: 1,
        shards: [
          { replicaId: "x", pid: "nope" },
          { replicaId: "y", spec: 5 },
        ],
      }),
    );
    const r = await rig({}, dir);
    expect(r.sup.list()).toEqual([]);
    writeFileSync(join(dir, "engines.json"), "{not json");
    const sup = await r.open();
    expect(sup.list()).toEqual([]);
  });

  it("serialises racing starts, relaunches a dead shard when asked again, replaces on a new generation", async () => {
    const r = await rig({ restart: { enabled: false } });
    const s = await spec();
    await Promise.all([r.sup.start(s), r.sup.start(s)]);
    const ready = await r.waitState(s.replicaId, "ready");
    // The second start is a claim: it re-reports the same engine, never a second one.
    const pids = new Set(r.events.filter((e) => e.pid > 0).map((e) => e.pid));
    expect([...pids]).toEqual([ready.pid]);
    process.kill(ready.pid, "SIGKILL");
    await r.waitState(s.replicaId, "failed_running");
    let mark = r.events.length;
    await r.sup.start(s);
    const again = await r.waitState(s.replicaId, "ready", 10_000, mark);
    mark = r.events.length;
    const next = create(StartShardSchema, { ...s, generation: 2n });
    await r.sup.start(next);
    const replaced = await r.waitState(s.replicaId, "ready", 10_000, mark);
    expect(replaced.spec?.generation).toBe(2n);
    expect(alive(again.pid)).toBe(false);
    expect(r.sup.list()).toHaveLength(1);
  });

  it("answers stop and drain of an unknown shard with stopped", async () => {
    const r = await rig();
    await r.sup.stop("ghost", "cp says stop");
    expect((await r.waitState("ghost", "stopped")).reason).toBe("cp says stop: not running on this node");
    await r.sup.drain("ghost2", 1_000);
    expect((await r.waitState("ghost2", "stopped")).reason).toBe("drain requested: not running on this node");
  });

  it("never adopts a process the state file names that is not the engine (PID reuse, tampering)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-sup-"));
    const s = await spec({ model: "no-such-model-xyz" });
    // Our own PID with its real start time: alive, but not an engine.
    writeFileSync(
      join(dir, "engines.json"),
      JSON.stringify({
        version: 1,
        shards: [
          {
            replicaId: s.replicaId,
            spec: toJson(StartShardSchema, s),
            pid: process.pid,
            startTime: readStartTime(process.pid),
            logPath: join(dir, "x.log"),
            state: "ready",
            sinceUnixMs: Date.now(),
            failures: 0,
            drainDeadlineUnixMs: null,
          },
        ],
      }),
    );
    const r = await rig({ restart: { enabled: false } }, dir);
    const failed = await r.waitState(s.replicaId, "failed_running");
    expect(failed.reason).toMatch(/^engine exited while the agent was down/);
    expect(failed.pid).toBe(0);
  });

  it.skipIf(!existsSync(SHIM))("runs the real sim engine through the test/bin/vllm shim", async () => {
    const r = await rig({ bins: { vllm: SHIM } });
    const s = await spec();
    await r.sup.start(s);
    const ready = await r.waitState(s.replicaId, "ready", 20_000);
    expect(ready.pid).toBeGreaterThan(0);
    const load = await waitUntil("sim load", () => r.loads.find((l) => l.replicaId === s.replicaId), 10_000);
    // An idle engine, read through the shim: nothing running or waiting, its cache empty.
    expect(load.load).toMatchObject({ running: 0, waiting: 0, kvUsage: 0 });
  });
});

describe.skipIf(!existsSync(SHIM))("Supervisor with the sim engine as vLLM across two nodes", () => {
  it("rank 0 serves and becomes ready, rank 1 runs --headless; a rank failure is left to the control plane", async () => {
    const [http0, dist0, http1] = [await freePort(), await freePort(), await freePort()];
    const base = {
      replicaId: `pp2-${Math.random().toString(36).slice(2, 8)}`,
      worldNodes: 2,
      gpuIndices: [0, 1],
      tensorParallel: 2,
      pipelineParallel: 2,
      peers: [
        { rank: 0, nodeName: "a", address: "127.0.0.1", ports: { http: http0, distInit: [dist0] } },
        { rank: 1, nodeName: "b", address: "127.0.0.1", ports: { http: http1 } },
      ],
    };
    const nodeA = await rig({ bins: { vllm: SHIM } });
    const nodeB = await rig({ bins: { vllm: SHIM } });
    const r0 = await spec({ ...base, rank: 0, ports: { http: http0, distInit: [dist0] } });
    const r1 = await spec({ ...base, rank: 1, ports: { http: http1 } });
    await Promise.all([nodeA.sup.start(r0), nodeB.sup.start(r1)]);
    const ready0 = await nodeA.waitState(r0.replicaId, "ready", 20_000);
    const ready1 = await nodeB.waitState(r1.replicaId, "ready", 20_000);
    expect(ready1.reason).toBe("running (headless rank: no HTTP server)");
    const log1 = readFileSync(join(nodeB.dir, "logs", `${r1.replicaId}.log`), "utf8");
    expect(log1).toContain(
      `--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port ${dist0} --headless`,
    );
    process.kill(ready0.pid, "SIGKILL");
    const failed = await nodeA.waitState(r0.replicaId, "failed_running");
    expect(failed.reason).toMatch(/not restarting: a multi-node replica restarts as a whole$/);
  });
});

describe("Supervisor across a killed agent", () => {
  it("the engine outlives kill -9 of its agent and the next agent adopts it", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-sup-"));
    const s = await spec();
    const agent = startProcess("agent", process.execPath, [
      "--import",
      "tsx",
      join(REPO, "test/engines/fixtures/agent-that-dies.ts"),
      dir,
      FAKE,
      toJsonString(StartShardSchema, s),
    ]);
    cleanups.push(() => agent.kill("SIGKILL"));
    const line = await agent.waitFor(/READY \d+/, 20_000);
    const pid = Number(line.split(" ")[1]);
    agent.child.kill("SIGKILL");
    await agent.exited;
    expect(alive(pid)).toBe(true);
    const r = await rig({}, dir);
    const adopted = await r.waitState(s.replicaId, "ready");
    expect(adopted.pid).toBe(pid);
  });
});

describe("Supervisor.shutdown (agent --stop-engines-on-exit)", () => {
  it("stops every engine — ready, loading, waiting out a restart, one being started — and leaves nothing to adopt", async () => {
    const r = await rig({ restart: { baseMs: 60_000 }, healthIntervalMs: 50, livenessIntervalMs: 100_000 });
    const sup = r.sup;
    const named = async (replicaId: string, env: Record<string, string> = {}) =>
      spec({ replicaId, env, startupDeadlineMs: 60_000 });

    await sup.start(await named("ready"));
    await r.waitState("ready", "ready");
    await sup.start(await named("loading", { FAKE_NEVER_READY: "1" }));
    // Ready first, then the crash: a crash before the first health check
    // would be a startup failure, which a loaded machine made this once.
    await sup.start(await named("crashed", { FAKE_EXIT_AFTER_MS: "3000", FAKE_EXIT_CODE: "3" }));
    await r.waitState("crashed", "ready");
    const failed = await r.waitState("crashed", "failed_running");
    expect(failed.restartAt).toBeGreaterThan(0);
    const late = sup.start(await named("late"));

    await sup.shutdown("agent exiting");
    await late;

    const pids = r.events.map((e) => e.pid).filter((p) => p > 0);
    expect(pids.length).toBeGreaterThanOrEqual(3);
    expect(pids.filter(alive)).toEqual([]);
    for (const id of ["ready", "loading", "crashed", "late"]) {
      expect(r.events.findLast((e) => e.replicaId === id)).toMatchObject({
        state: "stopped",
        reason: "agent exiting",
      });
    }
    expect(readStateFile(join(r.dir, STATE_FILE_NAME)).records).toEqual([]);

    const next = await r.open();
    expect(next.list()).toEqual([]);
  });
});
