/**
 * One shard's lifecycle, as a pure function: an event and the time it
 * happened in, the new lifecycle and the effects to carry out. No timers,
 * no processes, no I/O: the runner (runner.ts) performs the effects and
 * turns what they find into the next events, so every decision the agent
 * makes about an engine is here, and tested as a table on a fake clock.
 *
 *   launching ──launched──▶ starting ──healthy──▶ ready ──drain──▶ draining ──idle or deadline──▶ gone
 *       │                      │                    │                 │
 *       │ cannot launch        │ exit / deadline    │ exit / health   │ exit
 *       ▼                      ▼                    ▼                 ▼
 *   backoff or failed ◀──── (terminating) ◀────────┘               gone (stopped)
 *       │
 *       └──restart due──▶ launching
 *
 * `state` is what the agent reports (the shared ShardState); `phase` is
 * what it is doing about it. A phase ends everything begun in it: the
 * runner holds one AbortController per phase.
 */
import { doublingDelay } from "../../common/backoff.ts";
import { type FailedState, isFailed, type ShardState } from "../../common/shard-state.ts";
import type { StartShard } from "../../proto/gen/agent/v1/agent_pb.ts";
import type { LifecyclePolicy } from "./policy.ts";

/** What happens once a terminating engine is gone. */
export type Ending = { kind: "stop"; reason: string } | { kind: "fail"; state: FailedState; reason: string };

export type Phase =
  /** Read from a previous agent's state file; the runner is looking for its process. */
  | { name: "adopting"; drainDeadlineAt: number | null }
  /** Validating and spawning. */
  | { name: "launching" }
  | { name: "starting"; deadlineAt: number }
  | { name: "ready"; misses: number }
  | { name: "draining"; deadlineAt: number; settleAt: number; misses: number }
  /** SIGTERM sent (SIGKILL after the grace); `ending` is reported once the group is gone. */
  | { name: "terminating"; ending: Ending }
  | { name: "backoff"; restartAt: number }
  /** Failed, and no restart is coming (a StartShard of the same generation relaunches it). */
  | { name: "failed" }
  /** Stopped and forgotten. */
  | { name: "gone" };

export interface ShardLife {
  readonly spec: StartShard;
  readonly state: ShardState;
  readonly reason: string;
  readonly since: number;
  readonly exitCode?: number | undefined;
  /** The engine's last output lines; failures only. */
  readonly tail: readonly string[];
  readonly pid: number | null;
  /** Null for a headless rank (no HTTP server) or before the command line is built. */
  readonly healthUrl: string | null;
  readonly failures: number;
  /** False for an adopted shard until the control plane asks for it again. */
  readonly claimed: boolean;
  readonly phase: Phase;
}

export type Wake = "startup-deadline" | "headless-up" | "restart" | "forgive" | "drain-check";

export type LifeEvent =
  /** Launch now: a new shard, or a relaunch of a failed one asked for again. */
  | { kind: "launch" }
  | { kind: "launched"; pid: number; command: string; healthUrl: string | null }
  /** Validation refused or spawn failed; `retry` false when waiting cannot help (a bad spec). */
  | { kind: "launch-failed"; reason: string; retry: boolean }
  | { kind: "probed"; ok: boolean }
  | { kind: "exited"; pid: number; how: string; exitCode?: number | undefined; tail: string[] }
  | { kind: "terminated"; exitCode?: number | undefined; tail: string[] }
  /** Running + waiting in the engine; undefined when the scrape failed. */
  | { kind: "in-flight"; count: number | undefined }
  | { kind: "wake"; why: Wake }
  | { kind: "drain"; deadlineMs: number }
  | { kind: "stop"; reason: string; graceMs?: number | undefined }
  /** The control plane wants this shard; `report` re-sends its status (a StartShard of the running generation). */
  | { kind: "claim"; report: boolean }
  | { kind: "orphan-grace-over"; graceMs: number }
  /** Adoption's finding: the recorded engine, alive (and whether healthy), or gone. */
  | { kind: "found"; pid: number; healthUrl: string | null; healthy: boolean }
  | { kind: "not-found"; tail: string[] };

export type Effect =
  /** Send the current status to the control plane (a transition). */
  | { kind: "report" }
  /** Rewrite the state file. */
  | { kind: "persist" }
  /** Drop the shard from the supervisor. */
  | { kind: "forget" }
  /** Build the command line, validate, spawn → launched | launch-failed. */
  | { kind: "launch" }
  /** One health GET after `afterMs` → probed. */
  | { kind: "probe"; afterMs: number }
  | { kind: "wake"; afterMs: number; why: Wake }
  /** Scrape load every scrape interval for as long as the phase lasts. */
  | { kind: "watch-load" }
  /** One scrape → in-flight. */
  | { kind: "count-in-flight" }
  /** SIGTERM the group, SIGKILL after the grace → terminated. */
  | { kind: "terminate"; graceMs: number };

export interface Step {
  life: ShardLife;
  effects: Effect[];
}

const seconds = (ms: number) => (ms % 1000 === 0 ? `${ms / 1000}s` : `${(ms / 1000).toFixed(1)}s`);

const startupDeadline = (spec: StartShard, p: LifecyclePolicy) =>
  spec.startupDeadlineMs || p.defaultStartupDeadlineMs;

const stopGrace = (spec: StartShard, p: LifecyclePolicy) => spec.stopGraceMs || p.defaultStopGraceMs;

/** A shard asked for by a StartShard: launching at once. */
export function begin(spec: StartShard, failures: number, now: number): Step {
  const life: ShardLife = {
    spec,
    state: "starting",
    reason: "accepted",
    since: now,
    tail: [],
    pid: null,
    healthUrl: null,
    failures,
    claimed: true,
    phase: { name: "launching" },
  };
  return { life, effects: [{ kind: "launch" }] };
}

export function step(life: ShardLife, ev: LifeEvent, now: number, p: LifecyclePolicy): Step {
  const ph = life.phase;
  const same: Step = { life, effects: [] };
  switch (ev.kind) {
    case "launch":
      if (ph.name !== "failed" && ph.name !== "backoff") return same;
      return {
        life: { ...life, exitCode: undefined, tail: [], phase: { name: "launching" } },
        effects: [{ kind: "launch" }],
      };
    case "launched": {
      if (ph.name !== "launching") return same;
      const started = { ...life, pid: ev.pid, healthUrl: ev.healthUrl, exitCode: undefined, tail: [] };
      return beginStarting(started, `started ${ev.command} (pid ${ev.pid})`, now, p, 0);
    }
    case "launch-failed":
      if (ph.name !== "launching") return same;
      return fail(life, "failed_startup", ev.reason, now, p, ev.retry);
    case "probed":
      if (ph.name === "starting") {
        if (ev.ok) return becomeReady(life, `healthy at ${life.healthUrl}`, now, p);
        return { life, effects: [{ kind: "probe", afterMs: p.healthIntervalMs }] };
      }
      if (ph.name === "ready" || ph.name === "draining") {
        const misses = ev.ok ? 0 : ph.misses + 1;
        if (misses >= p.livenessFailures) {
          const reason = `health check failed ${misses} times in a row at ${life.healthUrl}`;
          return terminate(life, { kind: "fail", state: "failed_running", reason }, p);
        }
        return {
          life: { ...life, phase: { ...ph, misses } },
          effects: [{ kind: "probe", afterMs: p.livenessIntervalMs }],
        };
      }
      return same;
    case "exited": {
      if (ev.pid !== life.pid) return same;
      const dead = { ...life, exitCode: ev.exitCode, tail: ev.tail };
      if (ph.name === "starting") return fail(dead, "failed_startup", `${ev.how} during startup`, now, p);
      if (ph.name === "ready" || ph.name === "draining") return fail(dead, "failed_running", ev.how, now, p);
      return same;
    }
    case "terminated": {
      if (ph.name !== "terminating") return same;
      const e = ph.ending;
      if (e.kind === "stop") return end({ ...life, exitCode: ev.exitCode ?? life.exitCode }, e.reason, now);
      return fail({ ...life, exitCode: undefined, tail: ev.tail }, e.state, e.reason, now, p);
    }
    case "in-flight":
      if (ph.name !== "draining") return same;
      if (ev.count === 0) return stop(life, "drained: no requests in flight", undefined, now, p);
      return {
        life,
        effects: [
          {
            kind: "wake",
            afterMs: Math.min(p.drainPollMs, Math.max(0, ph.deadlineAt - now)),
            why: "drain-check",
          },
        ],
      };
    case "wake":
      return wake(life, ev.why, now, p);
    case "drain": {
      if (ph.name === "terminating" || ph.name === "gone" || ph.name === "draining") return same;
      if (ph.name !== "ready") return stop(life, "drained before it was ready", undefined, now, p);
      const reason = `draining, deadline ${seconds(ev.deadlineMs)}`;
      return beginDraining(life, reason, now + ev.deadlineMs, now + p.drainSettleMs, now, p);
    }
    case "stop":
      return stop(life, ev.reason, ev.graceMs, now, p);
    case "claim":
      if (ph.name === "gone") return same;
      return { life: { ...life, claimed: true }, effects: ev.report ? [{ kind: "report" }] : [] };
    case "orphan-grace-over":
      if (life.claimed) return same;
      return stop(
        life,
        `orphan: not claimed by the control plane within ${seconds(ev.graceMs)}`,
        undefined,
        now,
        p,
      );
    case "found":
    case "not-found":
      if (ph.name !== "adopting") return same;
      return adopt(life, ph.drainDeadlineAt, ev, now, p);
  }
}

function wake(life: ShardLife, why: Wake, now: number, p: LifecyclePolicy): Step {
  const ph = life.phase;
  const same: Step = { life, effects: [] };
  switch (why) {
    case "startup-deadline":
      if (ph.name !== "starting") return same;
      return terminate(
        life,
        {
          kind: "fail",
          state: "failed_startup",
          reason: `not healthy within the startup deadline of ${seconds(startupDeadline(life.spec, p))}`,
        },
        p,
      );
    case "headless-up":
      if (ph.name !== "starting") return same;
      return becomeReady(life, "running (headless rank: no HTTP server)", now, p);
    case "restart":
      if (ph.name !== "backoff") return same;
      return { life: { ...life, phase: { name: "launching" } }, effects: [{ kind: "launch" }] };
    case "forgive":
      // Only a long healthy stretch forgives past failures; a flapping engine keeps climbing the backoff.
      if (ph.name !== "ready" || life.failures === 0) return same;
      return { life: { ...life, failures: 0 }, effects: [{ kind: "persist" }] };
    case "drain-check":
      if (ph.name !== "draining") return same;
      if (now >= ph.deadlineAt) return stop(life, "drain deadline passed", undefined, now, p);
      if (now >= ph.settleAt) return { life, effects: [{ kind: "count-in-flight" }] };
      return {
        life,
        effects: [{ kind: "wake", afterMs: Math.min(ph.settleAt, ph.deadlineAt) - now, why: "drain-check" }],
      };
  }
}

/** A new reported state: the tail goes with anything but a failure, the exit code with anything but a stop. */
function enter(life: ShardLife, state: ShardState, reason: string, phase: Phase, now: number): ShardLife {
  const failed = isFailed(state);
  return {
    ...life,
    state,
    reason,
    since: now,
    phase,
    tail: failed ? life.tail : [],
    exitCode: failed || state === "stopped" ? life.exitCode : undefined,
  };
}

/** Health polling while starting: a probe, or for a headless rank one poll interval alive. */
function watchStartup(life: ShardLife, p: LifecyclePolicy, afterMs: number): Effect[] {
  if (life.healthUrl === null) return [{ kind: "wake", afterMs: p.healthIntervalMs, why: "headless-up" }];
  return [{ kind: "probe", afterMs }];
}

/** While ready or draining: load, and liveness (an engine whose core died still answers TCP). */
function watchServing(life: ShardLife, p: LifecyclePolicy): Effect[] {
  const effects: Effect[] = [{ kind: "watch-load" }];
  if (life.healthUrl !== null && p.livenessFailures > 0)
    effects.push({ kind: "probe", afterMs: p.livenessIntervalMs });
  return effects;
}

/** A new reported state, written down and reported; then what `more` asks for in it. */
function transition(
  life: ShardLife,
  state: ShardState,
  reason: string,
  phase: Phase,
  now: number,
  more: (next: ShardLife) => Effect[] = () => [],
): Step {
  const next = enter(life, state, reason, phase, now);
  return { life: next, effects: [{ kind: "persist" }, { kind: "report" }, ...more(next)] };
}

/** Starting: health polled from `firstProbeMs` on, failed at the startup deadline. */
function beginStarting(
  life: ShardLife,
  reason: string,
  now: number,
  p: LifecyclePolicy,
  firstProbeMs: number,
): Step {
  const deadline = startupDeadline(life.spec, p);
  return transition(
    life,
    "starting",
    reason,
    { name: "starting", deadlineAt: now + deadline },
    now,
    (next) => [
      { kind: "wake", afterMs: deadline, why: "startup-deadline" },
      ...watchStartup(next, p, firstProbeMs),
    ],
  );
}

function becomeReady(life: ShardLife, reason: string, now: number, p: LifecyclePolicy): Step {
  return transition(life, "ready", reason, { name: "ready", misses: 0 }, now, (next) => [
    { kind: "wake", afterMs: p.restart.resetAfterMs, why: "forgive" },
    ...watchServing(next, p),
  ]);
}

/** Draining: still serving what it has; stopped once idle after `settleAt`, or at `deadlineAt`. */
function beginDraining(
  life: ShardLife,
  reason: string,
  deadlineAt: number,
  settleAt: number,
  now: number,
  p: LifecyclePolicy,
): Step {
  const phase: Phase = { name: "draining", deadlineAt, settleAt, misses: 0 };
  return transition(life, "draining", reason, phase, now, (next) => [
    ...watchServing(next, p),
    { kind: "wake", afterMs: Math.max(0, Math.min(settleAt, deadlineAt) - now), why: "drain-check" },
  ]);
}

function terminate(life: ShardLife, ending: Ending, p: LifecyclePolicy, graceMs?: number): Step {
  return {
    life: { ...life, phase: { name: "terminating", ending } },
    effects: [{ kind: "terminate", graceMs: graceMs ?? stopGrace(life.spec, p) }],
  };
}

function stop(
  life: ShardLife,
  reason: string,
  graceMs: number | undefined,
  now: number,
  p: LifecyclePolicy,
): Step {
  const ph = life.phase;
  if (ph.name === "gone") return { life, effects: [] };
  if (ph.name === "terminating") {
    // Already on its way out; a stop asked for meanwhile wins over a failure's restart.
    if (ph.ending.kind === "stop") return { life, effects: [] };
    return {
      life: { ...life, phase: { name: "terminating", ending: { kind: "stop", reason } } },
      effects: [],
    };
  }
  if (life.pid === null) return end(life, reason, now);
  return terminate(life, { kind: "stop", reason }, p, graceMs);
}

/**
 * Stopped, and forgotten: a deliberate stop leaves the state file, so the
 * next agent has nothing to adopt or count.
 */
function end(life: ShardLife, reason: string, now: number): Step {
  const next = enter({ ...life, pid: null }, "stopped", reason, { name: "gone" }, now);
  return { life: next, effects: [{ kind: "report" }, { kind: "forget" }, { kind: "persist" }] };
}

/**
 * A failure, reported with what happens next — the restart it schedules, or
 * why there is none — so the report comes first and says so.
 */
function fail(
  life: ShardLife,
  state: FailedState,
  reason: string,
  now: number,
  p: LifecyclePolicy,
  retry = true,
): Step {
  // It was on its way out anyway: done, not failed, and not restarted.
  if (life.state === "draining") return end(life, `${reason} while draining`, now);
  const dead = { ...life, pid: null };
  let next: string;
  if (!retry) next = "; not restarting: the spec cannot run on this node";
  else if (!p.restart.enabled) next = "; not restarting (agent restarts disabled)";
  else if (life.spec.worldNodes > 1) next = "; not restarting: a multi-node replica restarts as a whole";
  else {
    const failures = life.failures + 1;
    const delay = doublingDelay(failures, p.restart.baseMs, p.restart.maxMs);
    const backoff: Phase = { name: "backoff", restartAt: now + delay };
    const reported = `${reason}; restart ${failures} in ${seconds(delay)}`;
    return transition({ ...dead, failures }, state, reported, backoff, now, () => [
      { kind: "wake", afterMs: delay, why: "restart" },
    ]);
  }
  return transition(dead, state, reason + next, { name: "failed" }, now);
}

function adopt(
  life: ShardLife,
  drainDeadlineAt: number | null,
  ev: Extract<LifeEvent, { kind: "found" | "not-found" }>,
  now: number,
  p: LifecyclePolicy,
): Step {
  const was = life.state;
  if (isFailed(was)) {
    // It had failed before the agent went away; its restart is still due
    // (at the step it had reached, not one further).
    const before = {
      ...life,
      failures: Math.max(0, life.failures - 1),
      phase: { name: "launching" } as const,
    };
    return fail(before, was, `${was} before the agent restarted`, now, p);
  }
  if (ev.kind === "not-found") {
    if (was === "draining") {
      return end({ ...life, tail: ev.tail }, "exited while the agent was down (was draining)", now);
    }
    return fail(
      { ...life, tail: ev.tail },
      was === "starting" ? "failed_startup" : "failed_running",
      "engine exited while the agent was down (exit code unknown)",
      now,
      p,
    );
  }
  const found = { ...life, pid: ev.pid, healthUrl: ev.healthUrl };
  if (was === "draining")
    return beginDraining(found, `adopted pid ${ev.pid}, still draining`, drainDeadlineAt ?? now, now, now, p);
  if (ev.healthy) return becomeReady(found, `adopted pid ${ev.pid} after agent restart`, now, p);
  // Alive but not (or not yet) healthy: a fresh startup deadline, since how
  // long it has been loading is not something the agent could watch.
  return beginStarting(found, `adopted pid ${ev.pid}, waiting for health`, now, p, p.healthIntervalMs);
}
