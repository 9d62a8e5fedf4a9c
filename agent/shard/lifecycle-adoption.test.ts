/**
 * The shard lifecycle after an agent restart, one row each (docs/engines.md,
 * "State file and adoption"): what a recorded shard becomes once its
 * process is found, or not.
 */
import { describe } from "vitest";
import {
  adopting,
  checkRows,
  GONE,
  REPORT,
  type Row,
  SERVING,
  T,
  URL,
} from "../../test/fixtures/shard-life.ts";

const rows: Record<string, Row> = {
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
};

describe("the shard lifecycle: adoption", () => {
  checkRows(rows);
});
