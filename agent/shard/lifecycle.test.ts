/**
 * Every transition of docs/engines.md ("Supervision", "State file and
 * adoption"), one row each: a shard in some phase, an event at a time on a
 * fake clock, and what it becomes and asks for. Times are absolute (ms);
 * the shard has been in its phase since 0.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { StartShardSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import {
  begin,
  DEFAULT_POLICY,
  type Effect,
  type Ending,
  fromRecord,
  type LifecyclePolicy,
  type LifeEvent,
  type Phase,
  persistedState,
  reportOf,
  type ShardLife,
  step,
} from "./lifecycle.ts";

const P: LifecyclePolicy = DEFAULT_POLICY; // restart 10 s doubling to 5 min, reset after 10 min; health 1 s; liveness 5 s × 6
const URL = "http://127.0.0.1:20000/health";
const T = 100_000;

const spec = (over: MessageInitShape<typeof StartShardSchema> = {}) =>
  create(StartShardSchema, {
    replicaId: "m/p/0",
    engine: "vllm",
    model: "org/m",
    worldNodes: 1,
    stopGraceMs: 0,
    startupDeadlineMs: 0,
    generation: 1n,
    ...over,
  });

/** A shard in `phase` with reported `state`. */
function life(phase: Phase, over: Partial<ShardLife> = {}): ShardLife {
  const state: ShardLife["state"] =
    phase.name === "backoff" || phase.name === "failed"
      ? "failed_running"
      : phase.name === "draining"
        ? "draining"
        : phase.name === "ready"
          ? "ready"
          : "starting";
  return {
    spec: spec(),
    state,
    reason: "before",
    since: 0,
    tail: [],
    pid: phase.name === "backoff" || phase.name === "failed" || phase.name === "launching" ? null : 42,
    healthUrl: URL,
    failures: 0,
    claimed: true,
    phase,
    ...over,
  };
}

const launching = life({ name: "launching" });
const starting = life({ name: "starting", deadlineAt: 20 * 60_000 });
const ready = life({ name: "ready", misses: 0 });
const draining = life({ name: "draining", deadlineAt: T + 8_000, settleAt: 2_000, misses: 0 });
const backoff = life({ name: "backoff", restartAt: T }, { failures: 1 });
const stopping = (ending: Ending, from = ready) =>
  life({ name: "terminating", ending }, { state: from.state, pid: 42 });
const adopting = (state: "starting" | "ready" | "draining" | "failed_running", failures = 0) =>
  fromRecord({
    spec: spec(),
    state,
    since: 0,
    failures,
    drainDeadlineAt: state === "draining" ? T + 5_000 : null,
  });

const REPORT: Effect[] = [{ kind: "persist" }, { kind: "report" }];
const GONE: Effect[] = [{ kind: "report" }, { kind: "forget" }, { kind: "persist" }];
const SERVING: Effect[] = [{ kind: "watch-load" }, { kind: "probe", afterMs: 5_000 }];

interface Row {
  from: ShardLife;
  event: LifeEvent;
  /** Fields of the shard afterwards (the phase compared by its fields). */
  after: Partial<Omit<ShardLife, "phase">> & { phase?: Phase };
  effects: Effect[];
  at?: number;
}

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

  // --- drain
  "ready → draining at once; the first check after the settle time": {
    from: ready,
    event: { kind: "drain", deadlineMs: 10_000 },
    after: {
      state: "draining",
      reason: "draining, deadline 10s",
      phase: { name: "draining", deadlineAt: T + 10_000, settleAt: T + 2_000, misses: 0 },
    },
    effects: [...REPORT, ...SERVING, { kind: "wake", afterMs: 2_000, why: "drain-check" }],
  },
  "draining, settled: count what is in flight": {
    from: draining,
    event: { kind: "wake", why: "drain-check" },
    after: { state: "draining" },
    effects: [{ kind: "count-in-flight" }],
  },
  "draining, requests in flight: check again after the poll interval": {
    from: draining,
    event: { kind: "in-flight", count: 3 },
    after: { state: "draining" },
    effects: [{ kind: "wake", afterMs: 1_000, why: "drain-check" }],
  },
  "draining, a failed scrape counts as busy; the next check is no later than the deadline": {
    from: draining,
    at: T + 7_500,
    event: { kind: "in-flight", count: undefined },
    after: { state: "draining" },
    effects: [{ kind: "wake", afterMs: 500, why: "drain-check" }],
  },
  "draining → stopping when idle": {
    from: draining,
    event: { kind: "in-flight", count: 0 },
    after: {
      phase: {
        name: "terminating",
        ending: { kind: "stop", reason: "drained: no requests in flight" },
      },
    },
    effects: [{ kind: "terminate", graceMs: 30_000 }],
  },
  "draining → stopping at the deadline, busy or not": {
    from: draining,
    at: T + 8_000,
    event: { kind: "wake", why: "drain-check" },
    after: {
      phase: { name: "terminating", ending: { kind: "stop", reason: "drain deadline passed" } },
    },
    effects: [{ kind: "terminate", graceMs: 30_000 }],
  },
  "draining → stopped when the engine exits: it was on its way out, not failed": {
    from: draining,
    event: { kind: "exited", pid: 42, how: "exited with code 0", exitCode: 0, tail: [] },
    after: {
      state: "stopped",
      reason: "exited with code 0 while draining",
      exitCode: 0,
      phase: { name: "gone" },
    },
    effects: GONE,
  },
  "a drain of a shard not yet ready stops it": {
    from: starting,
    event: { kind: "drain", deadlineMs: 10_000 },
    after: {
      phase: {
        name: "terminating",
        ending: { kind: "stop", reason: "drained before it was ready" },
      },
    },
    effects: [{ kind: "terminate", graceMs: 30_000 }],
  },
  "a drain of a shard waiting out its backoff: stopped at once (no process)": {
    from: backoff,
    event: { kind: "drain", deadlineMs: 10_000 },
    after: { state: "stopped", reason: "drained before it was ready", phase: { name: "gone" } },
    effects: GONE,
  },
  "a second drain changes nothing": {
    from: draining,
    event: { kind: "drain", deadlineMs: 60_000 },
    after: { phase: draining.phase },
    effects: [],
  },

  // --- stop
  "stop: SIGTERM, SIGKILL after the spec's grace": {
    from: life({ name: "ready", misses: 0 }, { spec: spec({ stopGraceMs: 1_000 }) }),
    event: { kind: "stop", reason: "stop requested" },
    after: {
      state: "ready",
      phase: { name: "terminating", ending: { kind: "stop", reason: "stop requested" } },
    },
    effects: [{ kind: "terminate", graceMs: 1_000 }],
  },
  "stop with the command's own grace": {
    from: ready,
    event: { kind: "stop", reason: "stop requested", graceMs: 500 },
    after: {},
    effects: [{ kind: "terminate", graceMs: 500 }],
  },
  "→ stopped once the group is gone, with the exit code it saw; the shard is forgotten": {
    from: stopping({ kind: "stop", reason: "test stop" }),
    event: { kind: "terminated", exitCode: 137, tail: ["ignored"] },
    after: {
      state: "stopped",
      reason: "test stop",
      exitCode: 137,
      tail: [],
      pid: null,
      phase: { name: "gone" },
    },
    effects: GONE,
  },
  "stop of a shard with no process (waiting out a restart): stopped at once": {
    from: backoff,
    event: { kind: "stop", reason: "agent exiting" },
    after: { state: "stopped", reason: "agent exiting", pid: null, phase: { name: "gone" } },
    effects: GONE,
  },
  "a stop while a failure is being carried out wins: no restart follows": {
    from: stopping({ kind: "fail", state: "failed_running", reason: "health check failed" }),
    event: { kind: "stop", reason: "stop requested" },
    after: {
      phase: { name: "terminating", ending: { kind: "stop", reason: "stop requested" } },
    },
    effects: [],
  },
  "a second stop changes nothing": {
    from: stopping({ kind: "stop", reason: "first" }),
    event: { kind: "stop", reason: "second" },
    after: { phase: { name: "terminating", ending: { kind: "stop", reason: "first" } } },
    effects: [],
  },
  "an exit during a stop is the stop's business": {
    from: stopping({ kind: "stop", reason: "first" }),
    event: { kind: "exited", pid: 42, how: "exited with code 0", exitCode: 0, tail: [] },
    after: { state: "ready" },
    effects: [],
  },

  // --- claims and orphans
  "a StartShard of the running generation claims it and re-reports it": {
    from: life({ name: "ready", misses: 0 }, { claimed: false }),
    event: { kind: "claim", report: true },
    after: { claimed: true, state: "ready" },
    effects: [{ kind: "report" }],
  },
  "claimed without a StartShard (supervisor.claim): nothing to report": {
    from: life({ name: "ready", misses: 0 }, { claimed: false }),
    event: { kind: "claim", report: false },
    after: { claimed: true },
    effects: [],
  },
  "unclaimed after the orphan grace: stopped": {
    from: life({ name: "ready", misses: 0 }, { claimed: false }),
    event: { kind: "orphan-grace-over", graceMs: 60_000 },
    after: {
      phase: {
        name: "terminating",
        ending: { kind: "stop", reason: "orphan: not claimed by the control plane within 60s" },
      },
    },
    effects: [{ kind: "terminate", graceMs: 30_000 }],
  },
  "claimed before the orphan grace ran out: kept": {
    from: ready,
    event: { kind: "orphan-grace-over", graceMs: 60_000 },
    after: { phase: ready.phase },
    effects: [],
  },

  // --- adoption
  "adopted, alive and healthy → ready with the same PID": {
    from: adopting("ready"),
    event: { kind: "found", pid: 9, healthUrl: URL, healthy: true },
    after: { state: "ready", reason: "adopted pid 9 after agent restart", pid: 9, claimed: false },
    effects: [...REPORT, { kind: "wake", afterMs: 10 * 60_000, why: "forgive" }, ...SERVING],
  },
  "adopted, alive but not healthy → starting with a fresh startup deadline": {
    from: adopting("ready"),
    event: { kind: "found", pid: 9, healthUrl: URL, healthy: false },
    after: {
      state: "starting",
      reason: "adopted pid 9, waiting for health",
      phase: { name: "starting", deadlineAt: T + 20 * 60_000 },
    },
    effects: [
      ...REPORT,
      { kind: "wake", afterMs: 20 * 60_000, why: "startup-deadline" },
      { kind: "probe", afterMs: 1_000 },
    ],
  },
  "adopted while draining → draining to the recorded deadline, checked at once": {
    from: adopting("draining"),
    event: { kind: "found", pid: 9, healthUrl: URL, healthy: true },
    after: {
      state: "draining",
      reason: "adopted pid 9, still draining",
      phase: { name: "draining", deadlineAt: T + 5_000, settleAt: T, misses: 0 },
    },
    effects: [...REPORT, ...SERVING, { kind: "wake", afterMs: 0, why: "drain-check" }],
  },
  "gone while the agent was down (was ready) → failed_running, exit code unknown, restart policy applies": {
    from: adopting("ready", 1),
    event: { kind: "not-found", tail: ["last words"] },
    after: {
      state: "failed_running",
      reason: "engine exited while the agent was down (exit code unknown); restart 2 in 20s",
      exitCode: undefined,
      tail: ["last words"],
      failures: 2,
    },
    effects: [...REPORT, { kind: "wake", afterMs: 20_000, why: "restart" }],
  },
  "gone while the agent was down (was starting) → failed_startup": {
    from: adopting("starting"),
    event: { kind: "not-found", tail: [] },
    after: {
      state: "failed_startup",
      reason: "engine exited while the agent was down (exit code unknown); restart 1 in 10s",
    },
    effects: [...REPORT, { kind: "wake", afterMs: 10_000, why: "restart" }],
  },
  "gone while the agent was down (was draining) → just stopped": {
    from: adopting("draining"),
    event: { kind: "not-found", tail: [] },
    after: {
      state: "stopped",
      reason: "exited while the agent was down (was draining)",
      phase: { name: "gone" },
    },
    effects: GONE,
  },
  "failed before the agent restarted: its restart is still due, at the step it had reached": {
    from: adopting("failed_running", 2),
    event: { kind: "not-found", tail: [] },
    after: {
      state: "failed_running",
      reason: "failed_running before the agent restarted; restart 2 in 20s",
      failures: 2,
      phase: { name: "backoff", restartAt: T + 20_000 },
    },
    effects: [...REPORT, { kind: "wake", afterMs: 20_000, why: "restart" }],
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
  it.each(Object.entries(rows))("%s", (name, row) => {
    const policy = name.startsWith("with agent restarts disabled") ? noRestart : P;
    const { life: next, effects } = step(row.from, row.event, row.at ?? T, policy);
    expect(next).toMatchObject(row.after);
    for (const [k, v] of Object.entries(row.after))
      if (v === undefined) expect(next).toHaveProperty(k, undefined);
    expect(effects).toEqual(row.effects);
  });

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
