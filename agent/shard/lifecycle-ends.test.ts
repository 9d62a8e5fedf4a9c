/**
 * The shard lifecycle's endings, one row each (docs/engines.md,
 * "Supervision"): a drain, a stop, a shard nobody claimed.
 */
import { describe } from "vitest";
import {
  backoff,
  checkRows,
  draining,
  GONE,
  life,
  REPORT,
  type Row,
  ready,
  SERVING,
  spec,
  starting,
  stopping,
  T,
} from "../../test/fixtures/shard-life.ts";

const rows: Record<string, Row> = {
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
};

describe("the shard lifecycle: drain, stop, orphans", () => {
  checkRows(rows);
});
