import { renameSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { errorMessage, type Logger } from "../../common/log.ts";
import type { ShardLoad } from "../../proto/gen/agent/v1/agent_pb.ts";
import { type EngineProcess, type ExitInfo, groupAlive, spawnEngine } from "../engine-process.ts";
import { type EngineLaunch, listenHost, type NodeContext, redacted } from "../engines/adapter.ts";
import { binaryFor, portsInUse } from "../engines/launch-facts.ts";
import { adapterFor, type EngineBins, knownEngines } from "../engines/registry.ts";
import {
  describeProblems,
  type GpuFact,
  mayClearUp,
  portsToBind,
  validateLaunch,
} from "../engines/validate.ts";
import { engineUrl, probeHealth } from "../health-probe.ts";
import { reportedTail } from "../output-tail.ts";
import type { ShardRecord } from "../state-file.ts";
import { type Effect, type LifeEvent, type ShardLife, step } from "./lifecycle.ts";
import { LoadWatch, type ScrapeSettings } from "./load-watch.ts";
import type { LifecyclePolicy } from "./policy.ts";
import { persistedState, reportOf, type ShardReport } from "./record.ts";

/** What the agent's /metrics counts of its engines. */
export interface SupervisorStats {
  /** Launches after a failure's backoff: the agent restarting an engine on its own. */
  restarts: number;
  /** Load scrapes of an engine's /metrics that failed (unreachable, timeout, HTTP error). */
  scrapeErrors: number;
  /** Engines found running from the state file at start and watched again, not relaunched. */
  adopted: number;
  /**
   * Where the orphan grace stands: not begun (no control plane has accepted
   * this agent yet), running, or over; and how many adopted engines nobody
   * claimed were stopped when it ended.
   */
  orphanGrace: "not_begun" | "running" | "over";
  orphansStopped: number;
}

/** What a runner needs from the supervisor around it. */
export interface RunnerContext {
  policy: LifecyclePolicy;
  node: Omit<NodeContext, "bin">;
  bins?: EngineBins | undefined;
  /** The engines' working directory. */
  stateDir: string;
  gpus?: (() => GpuFact[] | Promise<GpuFact[]>) | undefined;
  healthTimeoutMs: number;
  scrape: ScrapeSettings;
  log: Logger;
  now: () => number;
  /** False once the agent is shutting down: nothing new is launched, not even a restart after backoff. */
  mayLaunch(): boolean;
  report(status: ShardReport): void;
  load(replicaId: string, rank: number, load: ShardLoad): void;
  /** Counted for the agent's /metrics. */
  stats: SupervisorStats;
  persist(): void;
  forget(runner: ShardRunner): void;
}

/** The shard's command line for this node; null when the spec cannot be built (the launch says why). */
export function buildLaunch(ctx: RunnerContext, life: Pick<ShardLife, "spec">): EngineLaunch | undefined {
  const { spec } = life;
  return adapterFor(spec.engine)?.build(spec, { ...ctx.node, bin: ctx.bins?.[spec.engine] });
}

function describeExit(info: ExitInfo): string {
  if (info.error) return `could not start: ${info.error}`;
  if (!info.known) return "exited (exit code unknown: adopted engine)";
  if (info.signal) return `killed by ${info.signal} (exit code ${info.code})`;
  return `exited with code ${info.code}`;
}

/** True once `ms` have passed; false when the phase ended first. */
async function elapsed(ms: number, signal: AbortSignal): Promise<boolean> {
  try {
    await sleep(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}

/**
 * Carries out one shard's lifecycle: feeds events to the pure `step`,
 * performs the effects it asks for, and turns what they find into the next
 * events. Each phase has its own AbortController; entering a new phase
 * aborts the old one, so a timer, probe or scrape begun in it can never act
 * on a later phase.
 */
export class ShardRunner {
  private phase = new AbortController();
  /** The transition the log last told of (time, state, reason). */
  private logged = "";
  private readonly queue: LifeEvent[] = [];
  private stepping = false;
  private closed = false;
  private loads: LoadWatch | undefined;
  private readonly waiters = new Set<() => void>();
  /** The launch under way, if any: `start` resolves once it has spawned or failed. */
  launching: Promise<void> = Promise.resolve();
  proc: EngineProcess | null = null;
  launch: EngineLaunch | null = null;

  constructor(
    private readonly ctx: RunnerContext,
    public life: ShardLife,
    readonly logPath: string,
  ) {}

  get id(): string {
    return this.life.spec.replicaId;
  }

  get phaseName(): ShardLife["phase"]["name"] {
    return this.life.phase.name;
  }

  /** Applies `effects` of a step taken outside (the first one, `begin`). */
  run(effects: readonly Effect[]): void {
    for (const e of effects) this.perform(e, this.phase.signal);
  }

  dispatch(ev: LifeEvent): void {
    if (this.closed) return;
    this.queue.push(ev);
    // An effect may answer at once (terminate without a process); its event waits its turn.
    if (this.stepping) return;
    this.stepping = true;
    try {
      for (let next = this.queue.shift(); next; next = this.queue.shift()) this.apply(next);
    } finally {
      this.stepping = false;
    }
    for (const w of [...this.waiters]) w();
  }

  /** Resolves once the shard is stopped and forgotten (or the supervisor closed). */
  ended(): Promise<void> {
    return this.until((r) => r.phaseName === "gone");
  }

  report(): ShardReport {
    return reportOf(this.life);
  }

  record(): ShardRecord | null {
    const r = persistedState(this.life);
    if (!r) return null;
    return {
      replicaId: this.id,
      spec: r.spec,
      pid: this.life.pid,
      startTime: this.life.pid !== null ? (this.proc?.startTime ?? null) : null,
      logPath: this.logPath,
      state: r.state,
      sinceUnixMs: r.since,
      failures: r.failures,
      drainDeadlineUnixMs: r.drainDeadlineAt,
    };
  }

  /** The control plane's new scrape interval: the pending scrape runs now. */
  retune(): void {
    this.loads?.retune();
  }

  /** Stops acting on the engine and leaves it running, for the next agent to adopt. */
  close(): void {
    this.closed = true;
    this.phase.abort();
    for (const w of [...this.waiters]) w();
  }

  /** Watches a process this runner spawned or adopted. */
  attach(proc: EngineProcess, launch: EngineLaunch | null): void {
    this.proc = proc;
    this.launch = launch;
    void proc.exited.then((info) => this.onExit(proc, info));
  }

  /** Resolves once `done` holds after some event (or the supervisor closed). */
  until(done: (r: ShardRunner) => boolean): Promise<void> {
    if (done(this) || this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      const check = () => {
        if (!done(this) && !this.closed) return;
        this.waiters.delete(check);
        resolve();
      };
      this.waiters.add(check);
    });
  }

  private apply(ev: LifeEvent): void {
    const before = this.life.phase.name;
    const { life, effects } = step(this.life, ev, this.ctx.now(), this.ctx.policy);
    this.life = life;
    if (before === "backoff" && life.phase.name === "launching") this.ctx.stats.restarts++;
    if (life.pid === null) this.proc = null;
    if (life.phase.name !== before) {
      this.phase.abort();
      this.phase = new AbortController();
    }
    for (const e of effects) this.perform(e, this.phase.signal);
  }

  private perform(e: Effect, signal: AbortSignal): void {
    switch (e.kind) {
      case "report": {
        const { state, reason, since } = this.life;
        // A claim re-sends the status it already has: the log keeps one line per transition.
        const logged = `${since} ${state} ${reason}`;
        if (logged !== this.logged) {
          this.logged = logged;
          const fields = { replica: this.id, state, reason };
          if (state === "failed_startup" || state === "failed_running")
            this.ctx.log.warn("engine failed", fields);
          else this.ctx.log.info("shard state", fields);
        }
        this.ctx.report(this.report());
        return;
      }
      case "persist":
        this.ctx.persist();
        return;
      case "forget":
        this.ctx.forget(this);
        return;
      case "launch":
        this.launching = this.launchEngine(signal);
        return;
      case "probe":
        void this.probe(e.afterMs, signal);
        return;
      case "wake":
        void elapsed(e.afterMs, signal).then((ok) => ok && this.dispatch({ kind: "wake", why: e.why }));
        return;
      case "watch-load":
        void this.loadWatch()?.run(signal);
        return;
      case "count-in-flight":
        void this.countInFlight(signal);
        return;
      case "terminate":
        void this.terminate(e.graceMs, signal);
        return;
    }
  }

  private async launchEngine(signal: AbortSignal): Promise<void> {
    if (!this.ctx.mayLaunch()) return;
    const { spec } = this.life;
    let launch: EngineLaunch | undefined;
    try {
      launch = buildLaunch(this.ctx, this.life);
    } catch (err) {
      const reason = `cannot build the command line: ${errorMessage(err)}`;
      this.dispatch({ kind: "launch-failed", reason, retry: false });
      return;
    }
    let gpus: GpuFact[] | null = null;
    try {
      gpus = this.ctx.gpus ? await this.ctx.gpus() : null;
    } catch (err) {
      this.ctx.log.warn("no GPU inventory for validation", { error: errorMessage(err) });
    }
    const ports = launch ? await portsInUse(portsToBind(spec, launch), listenHost(this.ctx.node)) : [];
    if (signal.aborted || !this.ctx.mayLaunch()) return;
    const binary = launch ? binaryFor(spec.engine, launch.argv) : { name: "", found: true };
    const problems = validateLaunch(spec, launch, { gpus, portsInUse: ports, binary }, knownEngines());
    if (problems.length > 0 || !launch) {
      this.dispatch({
        kind: "launch-failed",
        reason: describeProblems(problems),
        retry: mayClearUp(problems),
      });
      return;
    }
    keepPreviousLog(this.logPath);
    let proc: EngineProcess;
    try {
      proc = spawnEngine(launch, this.logPath, this.ctx.stateDir);
    } catch (err) {
      const reason = `cannot spawn ${launch.argv[0]}: ${errorMessage(err)}`;
      this.dispatch({ kind: "launch-failed", reason, retry: false });
      return;
    }
    this.attach(proc, launch);
    this.ctx.log.info("engine started", {
      replica: spec.replicaId,
      pid: proc.pid,
      argv: launch.argv.map((a) => redacted(a, launch.apiKey)),
    });
    const healthUrl =
      launch.healthPath === null ? null : engineUrl(launch.probeHost, launch.port, launch.healthPath);
    this.dispatch({ kind: "launched", pid: proc.pid, command: launch.argv[0] ?? "", healthUrl });
  }

  private async probe(afterMs: number, signal: AbortSignal): Promise<void> {
    const url = this.life.healthUrl;
    if (url === null || !(await elapsed(afterMs, signal))) return;
    const ok = await probeHealth(url, this.launch?.healthTimeoutMs ?? this.ctx.healthTimeoutMs);
    if (!signal.aborted) this.dispatch({ kind: "probed", ok });
  }

  private loadWatch(): LoadWatch | undefined {
    const launch = this.launch;
    if (!launch || launch.metricsPath === null) return undefined;
    const { replicaId, rank } = this.life.spec;
    this.loads ??= new LoadWatch(
      { ...launch, metricsPath: launch.metricsPath },
      this.ctx.scrape,
      (load) => this.ctx.load(replicaId, rank, load),
      this.ctx.log,
      replicaId,
      () => this.ctx.stats.scrapeErrors++,
    );
    return this.loads;
  }

  /** An engine without metrics (a headless rank) has nothing in flight that it could tell. */
  private async countInFlight(signal: AbortSignal): Promise<void> {
    const watch = this.loadWatch();
    const count = watch ? await watch.inFlight() : 0;
    if (!signal.aborted) this.dispatch({ kind: "in-flight", count });
  }

  private async onExit(proc: EngineProcess, info: ExitInfo): Promise<void> {
    // A stop in progress waits for the exit itself.
    if (this.proc !== proc || this.closed || this.life.phase.name === "terminating") return;
    // The leader is gone; its workers must not linger holding VRAM.
    if (groupAlive(proc.pid)) proc.signalGroup("SIGKILL");
    const tail = await reportedTail(this.logPath, this.life.spec.engineApiKey);
    const exitCode = info.known && info.code !== null ? info.code : undefined;
    this.dispatch({ kind: "exited", pid: proc.pid, how: describeExit(info), exitCode, tail });
  }

  /** SIGTERM to the group, up to `graceMs` for it (and any workers it forked) to go, then SIGKILL. */
  private async terminate(graceMs: number, signal: AbortSignal): Promise<void> {
    const proc = this.proc;
    let exitCode: number | undefined;
    if (proc) {
      const deadline = Date.now() + graceMs;
      if (!proc.hasExited() || groupAlive(proc.pid)) proc.signalGroup("SIGTERM");
      await within(proc.exited, graceMs);
      while (groupAlive(proc.pid) && Date.now() < deadline) await sleep(50);
      if (!proc.hasExited() || groupAlive(proc.pid)) {
        this.ctx.log.warn("engine ignored SIGTERM, killing", { replica: this.id, pid: proc.pid, graceMs });
        proc.signalGroup("SIGKILL");
      }
      const info = await within(proc.exited, 5_000);
      if (info?.known && info.code !== null) exitCode = info.code;
    }
    const tail = proc ? await reportedTail(this.logPath, this.life.spec.engineApiKey) : [];
    if (!signal.aborted) this.dispatch({ kind: "terminated", exitCode, tail });
  }
}

/** `p`, or undefined after `ms`. The timer goes with the race: left pending, it would hold an exiting agent up. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  const quit = new AbortController();
  try {
    return await Promise.race([p, sleep(ms, undefined, { signal: quit.signal }).catch(() => undefined)]);
  } finally {
    quit.abort();
  }
}

/** Keeps one previous log beside the current one (the run before a crash loop is often the telling one). */
function keepPreviousLog(path: string): void {
  try {
    renameSync(path, path.replace(/\.log$/, ".prev.log"));
  } catch {
    // No previous log.
  }
}
