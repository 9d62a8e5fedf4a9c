/**
 * Every transition of docs/engines.md ("Supervision"), one row each: a
 * shard in some phase, an event at a time on a fake clock, and what it
 * becomes and asks for. Drain, stop and orphans are in
 * lifecycle-ends.test.ts, adoption in lifecycle-adoption.test.ts; the
 * fixtures in test/fixtures/shard-life.ts.
 */
import { describe, expect, it } from "vitest";
import {
  backoff,
  checkRows,
  draining,
  launching,
  life,
  P,
  REPORT,
  type Row,
  ready,
  SERVING,
  spec,
  starting,
  stopping,
  T,
  URL,
} from "../../test/fixtures/shard-life.ts";
import { begin } from "./lifecycle.ts";
import type { LifecyclePolicy } from "./policy.ts";
import { persistedState, reportOf } from "./record.ts";

const rows: Record<string, Row> = {
  // --- launching
  "launching → starting once spawned": {
    from: launching,
    event: { kind: "launched", pid: 7, command: "vllm", healthUrl: URL },
    after: {
      state: "starting",
      reason: "started vllm (pid 7)",
      since: T,
      pid: 7,
      phase: { name: "starting", deadlineAt: T + 20 * 60_000 },
    },
    effects: [
      ...REPORT,
      { kind: "wake", afterMs: 20 * 60_000, why: "startup-deadline" },
      { kind: "probe", afterMs: 0 },
    ],
  },
  "launching → starting, a headless rank waits one poll interval instead of probing": {
    from: launching,
    event: { kind: "launched", pid: 7, command: "vllm", healthUrl: null },
    after: { state: "starting", healthUrl: null },
    effects: [
      ...REPORT,
      { kind: "wake", afterMs: 20 * 60_000, why: "startup-deadline" },
      { kind: "wake", afterMs: 1_000, why: "headless-up" },
    ],
  },
  "launching → failed_startup, validation refused for something that may clear up: restart after backoff": {
    from: launching,
    event: {
      kind: "launch-failed",
      reason: "validation failed: port 20000 is already in use on this node",
      retry: true,
    },
    after: {
      state: "failed_startup",
      reason: "validation failed: port 20000 is already in use on this node; restart 1 in 10s",
      failures: 1,
      phase: { name: "backoff", restartAt: T + 10_000 },
    },
    effects: [...REPORT, { kind: "wake", afterMs: 10_000, why: "restart" }],
  },
  "launching → failed_startup, a spec that cannot run here is not retried": {
    from: launching,
    event: { kind: "launch-failed", reason: "validation failed: GPU 9 does not exist", retry: false },
    after: {
      state: "failed_startup",
      reason: "validation failed: GPU 9 does not exist; not restarting: the spec cannot run on this node",
      failures: 0,
      phase: { name: "failed" },
    },
    effects: REPORT,
  },

  // --- starting
  "starting → ready when healthy": {
    from: starting,
    event: { kind: "probed", ok: true },
    after: { state: "ready", reason: `healthy at ${URL}`, since: T, phase: { name: "ready", misses: 0 } },
    effects: [...REPORT, { kind: "wake", afterMs: 10 * 60_000, why: "forgive" }, ...SERVING],
  },
  "starting, not healthy yet: probe again after the health interval": {
    from: starting,
    event: { kind: "probed", ok: false },
    after: { state: "starting", phase: starting.phase },
    effects: [{ kind: "probe", afterMs: 1_000 }],
  },
  "starting → ready, a headless rank that stayed up one interval (load only, nothing to probe)": {
    from: life({ name: "starting", deadlineAt: T * 2 }, { healthUrl: null }),
    event: { kind: "wake", why: "headless-up" },
    after: { state: "ready", reason: "running (headless rank: no HTTP server)" },
    effects: [...REPORT, { kind: "wake", afterMs: 10 * 60_000, why: "forgive" }, { kind: "watch-load" }],
  },
  "starting → failed_startup when the engine exits, with its exit code and tail": {
    from: starting,
    event: { kind: "exited", pid: 42, how: "exited with code 3", exitCode: 3, tail: ["crashing"] },
    after: {
      state: "failed_startup",
      reason: "exited with code 3 during startup; restart 1 in 10s",
      exitCode: 3,
      tail: ["crashing"],
      pid: null,
      phase: { name: "backoff", restartAt: T + 10_000 },
    },
    effects: [...REPORT, { kind: "wake", afterMs: 10_000, why: "restart" }],
  },
  "starting, past the startup deadline: the engine is stopped first": {
    from: life({ name: "starting", deadlineAt: T }, { spec: spec({ startupDeadlineMs: 700 }) }),
    event: { kind: "wake", why: "startup-deadline" },
    after: {
      state: "starting",
      phase: {
        name: "terminating",
        ending: {
          kind: "fail",
          state: "failed_startup",
          reason: "not healthy within the startup deadline of 0.7s",
        },
      },
    },
    effects: [{ kind: "terminate", graceMs: 30_000 }],
  },
  "… → failed_startup once it is gone, with its tail": {
    from: stopping(
      { kind: "fail", state: "failed_startup", reason: "not healthy within the startup deadline of 0.7s" },
      starting,
    ),
    event: { kind: "terminated", exitCode: 143, tail: ["loading"] },
    after: {
      state: "failed_startup",
      reason: "not healthy within the startup deadline of 0.7s; restart 1 in 10s",
      exitCode: undefined,
      tail: ["loading"],
      pid: null,
    },
    effects: [...REPORT, { kind: "wake", afterMs: 10_000, why: "restart" }],
  },

  // --- ready
  "ready → failed_running when the engine exits; the report says when it restarts": {
    from: life({ name: "ready", misses: 0 }, { failures: 1 }),
    event: {
      kind: "exited",
      pid: 42,
      how: "killed by SIGKILL (exit code 137)",
      exitCode: 137,
      tail: ["a", "b"],
    },
    after: {
      state: "failed_running",
      reason: "killed by SIGKILL (exit code 137); restart 2 in 20s",
      exitCode: 137,
      tail: ["a", "b"],
      failures: 2,
      phase: { name: "backoff", restartAt: T + 20_000 },
    },
    effects: [...REPORT, { kind: "wake", afterMs: 20_000, why: "restart" }],
  },
  "ready, one health miss: counted, polled again": {
    from: ready,
    event: { kind: "probed", ok: false },
    after: { state: "ready", phase: { name: "ready", misses: 1 } },
    effects: [{ kind: "probe", afterMs: 5_000 }],
  },
  "ready, a good health check clears the misses": {
    from: life({ name: "ready", misses: 4 }),
    event: { kind: "probed", ok: true },
    after: { phase: { name: "ready", misses: 0 } },
    effects: [{ kind: "probe", afterMs: 5_000 }],
  },
  "ready, health failing 6 times in a row: the engine is stopped first": {
    from: life({ name: "ready", misses: 5 }),
    event: { kind: "probed", ok: false },
    after: {
      state: "ready",
      phase: {
        name: "terminating",
        ending: {
          kind: "fail",
          state: "failed_running",
          reason: `health check failed 6 times in a row at ${URL}`,
        },
      },
    },
    effects: [{ kind: "terminate", graceMs: 30_000 }],
  },
  "… → failed_running once it is gone": {
    from: stopping({
      kind: "fail",
      state: "failed_running",
      reason: `health check failed 6 times in a row at ${URL}`,
    }),
    event: { kind: "terminated", exitCode: 0, tail: ["x"] },
    after: {
      state: "failed_running",
      reason: `health check failed 6 times in a row at ${URL}; restart 1 in 10s`,
    },
    effects: [...REPORT, { kind: "wake", afterMs: 10_000, why: "restart" }],
  },
  "ready for the reset time: past failures are forgiven": {
    from: life({ name: "ready", misses: 0 }, { failures: 3 }),
    event: { kind: "wake", why: "forgive" },
    after: { state: "ready", failures: 0 },
    effects: [{ kind: "persist" }],
  },

  // --- the restart policy
  "the backoff doubles up to its ceiling": {
    from: life({ name: "ready", misses: 0 }, { failures: 6 }),
    event: { kind: "exited", pid: 42, how: "exited with code 1", exitCode: 1, tail: [] },
    after: {
      reason: "exited with code 1; restart 7 in 300s",
      phase: { name: "backoff", restartAt: T + 300_000 },
    },
    effects: [...REPORT, { kind: "wake", afterMs: 300_000, why: "restart" }],
  },
  "a multi-node shard is not restarted by the agent: the control plane restarts the gang": {
    from: life({ name: "ready", misses: 0 }, { spec: spec({ worldNodes: 2 }) }),
    event: { kind: "exited", pid: 42, how: "exited with code 1", exitCode: 1, tail: [] },
    after: {
      state: "failed_running",
      reason: "exited with code 1; not restarting: a multi-node replica restarts as a whole",
      phase: { name: "failed" },
    },
    effects: REPORT,
  },
  "failed_running → launching once the backoff is over": {
    from: backoff,
    event: { kind: "wake", why: "restart" },
    after: { state: "failed_running", failures: 1, phase: { name: "launching" } },
    effects: [{ kind: "launch" }],
  },
  "failed, no restart coming → launching when the control plane asks for it again": {
    from: life({ name: "failed" }, { failures: 2, exitCode: 1, tail: ["x"] }),
    event: { kind: "launch" },
    after: { failures: 2, exitCode: undefined, tail: [], phase: { name: "launching" } },
    effects: [{ kind: "launch" }],
  },

  // --- late news from an earlier phase or process changes nothing
  "the exit of another process (an earlier run)": {
    from: ready,
    event: { kind: "exited", pid: 41, how: "exited with code 1", exitCode: 1, tail: [] },
    after: { state: "ready", phase: ready.phase },
    effects: [],
  },
  "a health answer after the shard failed": {
    from: backoff,
    event: { kind: "probed", ok: true },
    after: { state: "failed_running", phase: backoff.phase },
    effects: [],
  },
  "a startup deadline after the shard became ready": {
    from: ready,
    event: { kind: "wake", why: "startup-deadline" },
    after: { phase: ready.phase },
    effects: [],
  },
  "a spawn reported after a stop": {
    from: life({ name: "gone" }, { state: "stopped", pid: null }),
    event: { kind: "launched", pid: 7, command: "vllm", healthUrl: URL },
    after: { state: "stopped", pid: null },
    effects: [],
  },
};

const noRestart: LifecyclePolicy = { ...P, restart: { ...P.restart, enabled: false } };

describe("the shard lifecycle", () => {
  checkRows(rows);
  checkRows(
    {
      "with agent restarts disabled, a failure stays failed": {
        from: ready,
        at: T,
        event: { kind: "exited", pid: 42, how: "exited with code 1", exitCode: 1, tail: [] },
        after: {
          reason: "exited with code 1; not restarting (agent restarts disabled)",
          phase: { name: "failed" },
        },
        effects: REPORT,
      },
    },
    noRestart,
  );

  it("a StartShard begins launching; the report and the state file say what the shard is", () => {
    const { life: l, effects } = begin(spec({ rank: 1 }), 2, T);
    expect(effects).toEqual([{ kind: "launch" }]);
    expect(reportOf(l)).toMatchObject({
      replicaId: "m/p/0",
      rank: 1,
      state: "starting",
      reason: "accepted",
      pid: 0,
    });
    expect(persistedState(l)).toMatchObject({ state: "starting", failures: 2, drainDeadlineAt: null });
    expect(reportOf(backoff).restartAt).toBe(T);
    expect(persistedState(draining)?.drainDeadlineAt).toBe(T + 8_000);
    expect(persistedState(life({ name: "gone" }, { state: "stopped" }))).toBeNull();
  });
});
