import { mkdirSync, renameSync } from "node:fs";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { doublingDelay } from "../common/backoff.ts";
import { createLogger, errorMessage, type Logger } from "../common/log.ts";
import { shardStateName } from "../common/shard-state.ts";
import {
  type ShardLoad,
  ShardState,
  type ShardStatus,
  ShardStatusSchema,
  type StartShard,
} from "../proto/gen/agent/v1/agent_pb.ts";
import {
  adoptEngine,
  cmdlineMentions,
  type EngineProcess,
  type ExitInfo,
  groupAlive,
  groupMembers,
  processAlive,
  spawnEngine,
} from "./engine-process.ts";
import { type EngineLaunch, listenHost, type NodeContext } from "./engines/adapter.ts";
import { binaryFor, portsInUse } from "./engines/launch-facts.ts";
import { adapterFor, type EngineBins, knownEngines } from "./engines/registry.ts";
import {
  describeProblems,
  type GpuFact,
  type ProblemCode,
  portsToBind,
  validateLaunch,
} from "./engines/validate.ts";
import { engineUrl, probeHealth } from "./health-probe.ts";
import { readTail, TAIL_LINES, trimLog } from "./output-tail.ts";
import { LoadScraper } from "./scraper.ts";
import {
  type PersistedState,
  readStateFile,
  type ShardRecord,
  STATE_FILE_NAME,
  writeStateFile,
} from "./state-file.ts";

/**
 * Runs one engine process per shard and reports every state change.
 *
 *   starting → ready → draining → stopped
 *       ↘ failed_startup   ↘ failed_running   (→ starting again after backoff)
 *
 * The supervisor never talks to the control plane itself: the stream client
 * forwards what `onStatus` emits and calls start/stop/drain for what it
 * receives. Engines are detached, so closing the supervisor (agent exit)
 * leaves them serving; the next supervisor on the same state dir adopts them.
 */

export type StatusKind = "transition" | "load";

export interface RestartPolicy {
  /** Agent-local restart of a failed single-node shard. Multi-node shards are a gang: the control plane restarts those. */
  enabled: boolean;
  baseMs: number;
  maxMs: number;
  /** Healthy this long and the failure count starts over. */
  resetAfterMs: number;
}

export interface SupervisorOptions {
  stateDir: string;
  node: Omit<NodeContext, "bin">;
  /** Executable per engine (`--vllm-bin`, `--sglang-bin`, `--sim-bin`). */
  bins?: EngineBins;
  onStatus?: (status: ShardStatus, kind: StatusKind) => void;
  /** Current GPUs with free memory, for validation; omitted, GPU checks are skipped. */
  gpus?: () => GpuFact[] | Promise<GpuFact[]>;
  restart?: Partial<RestartPolicy>;
  /** Readiness poll while starting. */
  healthIntervalMs?: number;
  healthTimeoutMs?: number;
  /** Health poll once ready; `livenessFailures` misses in a row fail the shard (an engine whose core died still answers TCP). 0 disables. */
  livenessIntervalMs?: number;
  livenessFailures?: number;
  scrapeIntervalMs?: number;
  scrapeTimeoutMs?: number;
  /** How long adopted engines may stay unclaimed after `beginOrphanGrace()`. */
  orphanGraceMs?: number;
  /** Liveness poll for adopted (non-child) engines. */
  adoptPollMs?: number;
  defaultStartupDeadlineMs?: number;
  defaultStopGraceMs?: number;
  drainPollMs?: number;
  /** Minimum time in draining, so the edge hears of it before an idle engine is stopped. */
  drainSettleMs?: number;
  /** An engine log over this size is trimmed to its tail (checked every `logCheckMs`). */
  maxLogBytes?: number;
  logCheckMs?: number;
  logger?: Logger;
}

export const DEFAULT_RESTART: RestartPolicy = {
  enabled: true,
  baseMs: 10_000,
  maxMs: 5 * 60_000,
  resetAfterMs: 10 * 60_000,
};

type Timer = ReturnType<typeof setTimeout>;

const PERMANENT_PROBLEMS = new Set<ProblemCode>([
  "bad_spec",
  "unknown_engine",
  "parallel_mismatch",
  "unsupported",
  "gpu_missing",
]);

interface Shard {
  spec: StartShard;
  launch: EngineLaunch | null;
  state: ShardState;
  reason: string;
  since: number;
  exit?: number;
  tail: string[];
  proc: EngineProcess | null;
  logPath: string;
  failures: number;
  load?: ShardLoad;
  scraper?: LoadScraper;
  /** The pending scrape and what runs it, so a new interval applies at once. */
  nextScrape?: { timer: Timer; run: () => void } | undefined;
  /** False for an adopted shard until the control plane asks for it again. */
  claimed: boolean;
  drainDeadline: number | null;
  /** Timers of the current phase; cleared on every transition. */
  timers: Set<Timer>;
  /** Bumped whenever the process or phase changes, so late callbacks of an older one do nothing. */
  run: number;
  stopping?: Promise<void>;
  restartAt?: number;
}

const STATE_NAMES: Record<PersistedState, ShardState> = {
  starting: ShardState.STARTING,
  ready: ShardState.READY,
  draining: ShardState.DRAINING,
  failed_startup: ShardState.FAILED_STARTUP,
  failed_running: ShardState.FAILED_RUNNING,
};

function persistedName(s: ShardState): PersistedState | null {
  for (const [k, v] of Object.entries(STATE_NAMES)) if (v === s) return k as PersistedState;
  return null;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** `p`, or undefined after `ms`. The timer goes with the race: left pending, it would hold an exiting agent up. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: Timer | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

function safeFileName(id: string): string {
  return id.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 200) || "shard";
}

function seconds(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${(ms / 1000).toFixed(1)}s`;
}

function describeExit(info: ExitInfo): string {
  if (info.error) return `could not start: ${info.error}`;
  if (!info.known) return "exited (exit code unknown: adopted engine)";
  if (info.signal) return `killed by ${info.signal} (exit code ${info.code})`;
  return `exited with code ${info.code}`;
}

export class Supervisor {
  private readonly shards = new Map<string, Shard>();
  private readonly ops = new Map<string, Promise<unknown>>();
  private readonly opts: Required<
    Omit<SupervisorOptions, "gpus" | "onStatus" | "restart" | "bins" | "logger" | "node">
  >;
  private readonly restart: RestartPolicy;
  private readonly log: Logger;
  private readonly statePath: string;
  private readonly logDir: string;
  private orphanTimer: Timer | undefined;
  private logTimer: ReturnType<typeof setInterval> | undefined;
  private closed = false;
  /** Set by `shutdown()`: nothing new is launched, not even a restart after backoff. */
  private shuttingDown = false;

  private constructor(private readonly options: SupervisorOptions) {
    this.opts = {
      stateDir: options.stateDir,
      healthIntervalMs: options.healthIntervalMs ?? 1_000,
      healthTimeoutMs: options.healthTimeoutMs ?? 1_000,
      livenessIntervalMs: options.livenessIntervalMs ?? 5_000,
      livenessFailures: options.livenessFailures ?? 6,
      scrapeIntervalMs: options.scrapeIntervalMs ?? 2_000,
      scrapeTimeoutMs: options.scrapeTimeoutMs ?? 1_000,
      orphanGraceMs: options.orphanGraceMs ?? 60_000,
      adoptPollMs: options.adoptPollMs ?? 1_000,
      defaultStartupDeadlineMs: options.defaultStartupDeadlineMs ?? 20 * 60_000,
      defaultStopGraceMs: options.defaultStopGraceMs ?? 30_000,
      drainPollMs: options.drainPollMs ?? 1_000,
      drainSettleMs: options.drainSettleMs ?? 2_000,
      maxLogBytes: options.maxLogBytes ?? 256 * 1024 * 1024,
      logCheckMs: options.logCheckMs ?? 60_000,
    };
    this.restart = { ...DEFAULT_RESTART, ...options.restart };
    this.log = options.logger ?? createLogger({ component: "supervisor" });
    this.statePath = join(options.stateDir, STATE_FILE_NAME);
    this.logDir = join(options.stateDir, "logs");
  }

  /** Opens the state dir and adopts every engine a previous agent left running. */
  static async open(options: SupervisorOptions): Promise<Supervisor> {
    const sup = new Supervisor(options);
    mkdirSync(sup.logDir, { recursive: true });
    await sup.adoptAll();
    sup.logTimer = setInterval(() => {
      for (const s of sup.shards.values()) if (s.proc) void trimLog(s.logPath, sup.opts.maxLogBytes);
    }, sup.opts.logCheckMs);
    sup.logTimer.unref();
    return sup;
  }

  // ---------------------------------------------------------------- public API

  /**
   * Starts a shard, or claims it when this exact replica generation already
   * runs (a re-sent StartShard after an agent or control plane restart is an
   * adoption, not a restart). A different generation replaces the old one.
   */
  start(spec: StartShard): Promise<ShardStatus> {
    return this.serial(spec.replicaId, () => this.startNow(spec));
  }

  private async startNow(spec: StartShard): Promise<ShardStatus> {
    const id = spec.replicaId;
    const existing = this.shards.get(id);
    let failures = 0;
    if (existing) {
      await existing.stopping;
      const current = this.shards.get(id);
      const same = current && current.spec.generation === spec.generation && current.spec.rank === spec.rank;
      // A failed shard with no restart coming is relaunched when asked again;
      // anything else of the same generation is already what was asked for.
      const dead =
        current &&
        (current.state === ShardState.FAILED_RUNNING || current.state === ShardState.FAILED_STARTUP) &&
        current.restartAt === undefined;
      if (current && same && !dead) {
        current.claimed = true;
        const status = this.status(current);
        this.options.onStatus?.(status, "transition");
        return status;
      }
      if (current && same) failures = current.failures;
      if (current) {
        const why = same ? "relaunch requested" : `replaced by generation ${spec.generation}`;
        await this.stopShard(current, why, undefined, !same);
      }
    }
    const shard: Shard = {
      spec,
      launch: null,
      state: ShardState.STARTING,
      reason: "accepted",
      since: Date.now(),
      tail: [],
      proc: null,
      logPath: join(this.logDir, `${safeFileName(id)}.log`),
      failures,
      claimed: true,
      drainDeadline: null,
      timers: new Set(),
      run: 0,
    };
    this.shards.set(id, shard);
    await this.launch(shard);
    return this.status(shard);
  }

  /** Marks an adopted shard as wanted without a StartShard (e.g. listed in the control plane's ack). */
  claim(replicaId: string): boolean {
    const s = this.shards.get(replicaId);
    if (s) s.claimed = true;
    return s !== undefined;
  }

  /** SIGTERM to the engine's group, SIGKILL after the grace; reports stopped and forgets the shard. */
  stop(replicaId: string, reason = "stop requested", graceMs?: number): Promise<void> {
    return this.serial(replicaId, async () => {
      const s = this.shards.get(replicaId);
      if (!s) {
        this.reportUnknown(replicaId, reason);
        return;
      }
      await this.stopShard(s, reason, graceMs);
    });
  }

  /**
   * Reports draining at once (the edge stops routing to it), then stops the
   * engine when nothing is running or waiting in it, or at the deadline.
   */
  drain(replicaId: string, deadlineMs: number): Promise<void> {
    return this.serial(replicaId, () => this.drainNow(replicaId, deadlineMs));
  }

  private async drainNow(replicaId: string, deadlineMs: number): Promise<void> {
    const s = this.shards.get(replicaId);
    if (!s) {
      this.reportUnknown(replicaId, "drain requested");
      return;
    }
    if (s.stopping) return;
    if (s.state !== ShardState.READY && s.state !== ShardState.DRAINING) {
      await this.stopShard(s, "drained before it was ready", undefined);
      return;
    }
    if (s.state === ShardState.DRAINING) return;
    s.drainDeadline = Date.now() + deadlineMs;
    this.transition(s, ShardState.DRAINING, `draining, deadline ${seconds(deadlineMs)}`);
    this.watchDrain(s, Date.now() + this.opts.drainSettleMs);
  }

  /** Every shard this agent runs or is about to restart, for Register. */
  list(): ShardStatus[] {
    return [...this.shards.values()].map((s) => this.status(s));
  }

  /** PIDs of every engine process and the workers they forked, for telling our VRAM from foreign VRAM. */
  enginePids(): Set<number> {
    const leaders = new Set<number>();
    for (const s of this.shards.values()) if (s.proc?.pid) leaders.add(s.proc.pid);
    return groupMembers(leaders);
  }

  get(replicaId: string): ShardStatus | undefined {
    const s = this.shards.get(replicaId);
    return s && this.status(s);
  }

  /**
   * Starts the clock for adopted engines nobody claims. Call it once the
   * control plane has accepted this agent's Register, not at agent start: an
   * agent that restarts while the control plane is down must not stop every
   * engine on the node (engines never depend on the control plane).
   */
  beginOrphanGrace(graceMs = this.opts.orphanGraceMs): void {
    if (this.orphanTimer) return;
    this.orphanTimer = setTimeout(() => {
      for (const s of [...this.shards.values()]) {
        if (!s.claimed) {
          void this.stopShard(
            s,
            `orphan: not claimed by the control plane within ${seconds(graceMs)}`,
            undefined,
          );
        }
      }
    }, graceMs);
    this.orphanTimer.unref();
  }

  /** Stops every engine (tests; `shutdown()` for an agent that exits). */
  async stopAll(reason = "agent stopping engines"): Promise<void> {
    await Promise.all([...this.shards.values()].map((s) => this.stopShard(s, reason, undefined)));
  }

  /**
   * Stops every engine, then supervising (`llmgw agent --stop-engines-on-exit`).
   * A deliberate stop, not a crash: each shard is forgotten once its engine
   * has exited, so the state file is left without it and the next agent has
   * nothing to adopt or to count. Commands already under way finish first,
   * so none launches an engine after the stop has gone by.
   */
  async shutdown(reason: string): Promise<void> {
    this.shuttingDown = true;
    await Promise.all(this.ops.values());
    await this.stopAll(reason);
    this.close();
  }

  /** Stops supervising and leaves the engines running for the next agent to adopt. */
  close(): void {
    if (this.orphanTimer) clearTimeout(this.orphanTimer);
    if (this.logTimer) clearInterval(this.logTimer);
    for (const s of this.shards.values()) {
      s.run++;
      this.clearTimers(s);
    }
    this.persist();
    // From here on nothing may write the state file: the next agent owns it.
    this.closed = true;
  }

  // ------------------------------------------------------------------ launching

  private async launch(shard: Shard): Promise<void> {
    if (this.closed || this.shuttingDown) return;
    const run = ++shard.run;
    this.clearTimers(shard);
    shard.restartAt = undefined;
    shard.exit = undefined;
    shard.tail = [];
    shard.load = undefined;
    const { spec } = shard;
    const adapter = adapterFor(spec.engine);
    let launch: EngineLaunch | undefined;
    try {
      launch = adapter?.build(spec, { ...this.options.node, bin: this.options.bins?.[spec.engine] });
    } catch (err) {
      this.failStartup(shard, `cannot build the command line: ${errorMessage(err)}`);
      return;
    }
    let gpus: GpuFact[] | null = null;
    try {
      gpus = this.options.gpus ? await this.options.gpus() : null;
    } catch (err) {
      this.log.warn("no GPU inventory for validation", { error: errorMessage(err) });
    }
    const ports = launch ? await portsInUse(portsToBind(spec, launch), listenHost(this.options.node)) : [];
    if (run !== shard.run) return;
    const problems = validateLaunch(
      spec,
      launch,
      {
        gpus,
        portsInUse: ports,
        binary: launch ? binaryFor(spec.engine, launch.argv) : { name: "", found: true },
      },
      knownEngines(),
    );
    if (problems.length > 0 || !launch) {
      // A spec that cannot fit this node will not fit it in 10 s either;
      // busy ports, short memory or a missing binary may clear up.
      const permanent = problems.some((p) => PERMANENT_PROBLEMS.has(p.code));
      this.fail(shard, ShardState.FAILED_STARTUP, describeProblems(problems), !permanent);
      return;
    }
    shard.launch = launch;
    this.rotateLog(shard.logPath);
    let proc: EngineProcess;
    try {
      proc = spawnEngine(launch, shard.logPath, this.options.stateDir);
    } catch (err) {
      this.failStartup(shard, `cannot spawn ${launch.argv[0]}: ${errorMessage(err)}`);
      return;
    }
    shard.proc = proc;
    this.log.info("engine started", { replica: spec.replicaId, pid: proc.pid, argv: launch.argv });
    this.transition(shard, ShardState.STARTING, `started ${launch.argv[0]} (pid ${proc.pid})`);
    this.superviseStartup(shard, run, this.startupDeadline(spec));
  }

  private startupDeadline(spec: StartShard): number {
    return spec.startupDeadlineMs || this.opts.defaultStartupDeadlineMs;
  }

  /** Watches a starting engine: exit, readiness poll and the startup deadline. */
  private superviseStartup(shard: Shard, run: number, deadlineMs: number): void {
    const proc = shard.proc!;
    void proc.exited.then((info) => this.onExit(shard, run, info));
    const launch = shard.launch!;
    if (launch.healthPath === null) {
      // A headless rank has nothing to probe; one poll interval alive is as
      // ready as it can show. The replica's readiness is its rank 0's.
      this.after(shard, run, this.opts.healthIntervalMs, () => {
        if (!proc.hasExited()) this.markReady(shard, "running (headless rank: no HTTP server)");
      });
      return;
    }
    const url = engineUrl(launch.probeHost, launch.port, launch.healthPath);
    const poll = async () => {
      if (run !== shard.run) return;
      if (await probeHealth(url, this.opts.healthTimeoutMs)) {
        if (run === shard.run && shard.state === ShardState.STARTING)
          this.markReady(shard, `healthy at ${url}`);
        return;
      }
      this.after(shard, run, this.opts.healthIntervalMs, poll);
    };
    void poll();
    this.after(shard, run, deadlineMs, () => {
      if (shard.state !== ShardState.STARTING) return;
      void this.onStartupTimeout(shard, deadlineMs);
    });
  }

  private markReady(shard: Shard, reason: string): void {
    const run = shard.run;
    this.clearTimers(shard);
    this.transition(shard, ShardState.READY, reason);
    // Only a long healthy stretch forgives past failures; a flapping engine
    // keeps climbing the backoff.
    this.after(shard, run, this.restart.resetAfterMs, () => {
      shard.failures = 0;
      this.persist();
    });
    this.watchReady(shard, run);
  }

  /** While ready (and draining): scrape load, and poll health to catch an engine dead behind a live socket. */
  private watchReady(shard: Shard, run: number): void {
    const launch = shard.launch;
    if (!launch) return;
    if (launch.metricsPath !== null) {
      const scraper = this.scraperFor(shard, launch, launch.metricsPath);
      const scrape = async () => {
        if (run !== shard.run) return;
        try {
          const { load, errors } = await scraper.scrape();
          if (run !== shard.run) return;
          if (errors.length)
            this.log.debug("malformed metrics lines", { replica: shard.spec.replicaId, errors });
          shard.load = load;
          this.options.onStatus?.(this.status(shard, false), "load");
        } catch (err) {
          this.log.debug("scrape failed", { replica: shard.spec.replicaId, error: errorMessage(err) });
        }
        const timer = this.after(shard, run, this.opts.scrapeIntervalMs, scrape);
        shard.nextScrape = timer ? { timer, run: () => void scrape() } : undefined;
      };
      this.after(shard, run, 0, scrape);
    }
    if (launch.healthPath !== null && this.opts.livenessFailures > 0) {
      const url = engineUrl(launch.probeHost, launch.port, launch.healthPath);
      let misses = 0;
      const check = async () => {
        if (run !== shard.run) return;
        const ok = await probeHealth(url, this.opts.healthTimeoutMs);
        if (run !== shard.run) return;
        misses = ok ? 0 : misses + 1;
        if (misses >= this.opts.livenessFailures) {
          void this.failHealth(shard, `health check failed ${misses} times in a row at ${url}`);
          return;
        }
        this.after(shard, run, this.opts.livenessIntervalMs, check);
      };
      this.after(shard, run, this.opts.livenessIntervalMs, check);
    }
  }

  // ------------------------------------------------------------------- failures

  private async onExit(shard: Shard, run: number, info: ExitInfo): Promise<void> {
    if (run !== shard.run || this.shards.get(shard.spec.replicaId) !== shard) return;
    shard.run++;
    this.clearTimers(shard);
    // The leader is gone; its workers must not linger holding VRAM.
    if (shard.proc && groupAlive(shard.proc.pid)) shard.proc.signalGroup("SIGKILL");
    shard.tail = await readTail(shard.logPath, TAIL_LINES);
    shard.exit = info.known && info.code !== null ? info.code : undefined;
    const how = describeExit(info);
    if (shard.state === ShardState.STARTING)
      this.fail(shard, ShardState.FAILED_STARTUP, `${how} during startup`);
    else this.fail(shard, ShardState.FAILED_RUNNING, how);
  }

  private async onStartupTimeout(shard: Shard, deadlineMs: number): Promise<void> {
    shard.run++;
    this.clearTimers(shard);
    await this.terminate(shard, this.stopGrace(shard.spec));
    shard.tail = await readTail(shard.logPath, TAIL_LINES);
    this.fail(
      shard,
      ShardState.FAILED_STARTUP,
      `not healthy within the startup deadline of ${seconds(deadlineMs)}`,
    );
  }

  private async failHealth(shard: Shard, reason: string): Promise<void> {
    shard.run++;
    this.clearTimers(shard);
    await this.terminate(shard, this.stopGrace(shard.spec));
    shard.tail = await readTail(shard.logPath, TAIL_LINES);
    this.fail(shard, ShardState.FAILED_RUNNING, reason);
  }

  private failStartup(shard: Shard, reason: string): void {
    this.fail(shard, ShardState.FAILED_STARTUP, reason, false);
  }

  /**
   * Reports the failure — with the restart it schedules, so the report comes
   * first and says what happens next — then waits out the backoff.
   */
  private fail(shard: Shard, state: ShardState, reason: string, retry = true): void {
    if (this.shards.get(shard.spec.replicaId) !== shard || shard.stopping) return;
    shard.proc = null;
    shard.load = undefined;
    const run = ++shard.run;
    this.clearTimers(shard);
    if (shard.state === ShardState.DRAINING) {
      // It was on its way out anyway: done, not failed, and not restarted.
      shard.stopping = Promise.resolve();
      this.transition(shard, ShardState.STOPPED, `${reason} while draining`);
      this.shards.delete(shard.spec.replicaId);
      this.persist();
      return;
    }
    let next = "";
    if (!retry) next = "; not restarting: the spec cannot run on this node";
    else if (!this.restart.enabled) next = "; not restarting (agent restarts disabled)";
    else if (shard.spec.worldNodes > 1) next = "; not restarting: a multi-node replica restarts as a whole";
    else {
      shard.failures++;
      const delay = doublingDelay(shard.failures, this.restart.baseMs, this.restart.maxMs);
      shard.restartAt = Date.now() + delay;
      next = `; restart ${shard.failures} in ${seconds(delay)}`;
      this.after(shard, run, delay, () => void this.launch(shard));
    }
    this.log.warn("engine failed", { replica: shard.spec.replicaId, state: shardStateName(state), reason });
    this.transition(shard, state, reason + next);
  }

  // ------------------------------------------------------------------- stopping

  private stopGrace(spec: StartShard): number {
    return spec.stopGraceMs || this.opts.defaultStopGraceMs;
  }

  private stopShard(shard: Shard, reason: string, graceMs: number | undefined, report = true): Promise<void> {
    if (shard.stopping) return shard.stopping;
    shard.run++;
    this.clearTimers(shard);
    shard.stopping = (async () => {
      const info = await this.terminate(shard, graceMs ?? this.stopGrace(shard.spec));
      if (info?.known && info.code !== null) shard.exit = info.code;
      shard.proc = null;
      shard.load = undefined;
      // A replacement by a new generation reports the new shard instead; a
      // stopped old generation would read as the replica going away.
      if (report) this.transition(shard, ShardState.STOPPED, reason);
      if (this.shards.get(shard.spec.replicaId) === shard) this.shards.delete(shard.spec.replicaId);
      this.persist();
    })();
    return shard.stopping;
  }

  /** SIGTERM to the group, up to `graceMs` for it (and any workers it forked) to go, then SIGKILL. */
  private async terminate(shard: Shard, graceMs: number): Promise<ExitInfo | undefined> {
    const proc = shard.proc;
    if (!proc) return undefined;
    const deadline = Date.now() + graceMs;
    if (!proc.hasExited() || groupAlive(proc.pid)) proc.signalGroup("SIGTERM");
    await within(proc.exited, graceMs);
    while (groupAlive(proc.pid) && Date.now() < deadline) await sleep(50);
    if (!proc.hasExited() || groupAlive(proc.pid)) {
      this.log.warn("engine ignored SIGTERM, killing", {
        replica: shard.spec.replicaId,
        pid: proc.pid,
        graceMs,
      });
      proc.signalGroup("SIGKILL");
    }
    return within(proc.exited, 5_000);
  }

  private watchDrain(shard: Shard, notBefore: number): void {
    const run = shard.run;
    const deadline = shard.drainDeadline ?? Date.now();
    const check = async () => {
      if (run !== shard.run || shard.state !== ShardState.DRAINING) return;
      const now = Date.now();
      if (now >= deadline) {
        await this.stopShard(shard, "drain deadline passed", undefined);
        return;
      }
      if (now >= notBefore) {
        const inFlight = await this.inFlight(shard);
        if (run !== shard.run) return;
        if (inFlight === 0) {
          await this.stopShard(shard, "drained: no requests in flight", undefined);
          return;
        }
      }
      this.after(shard, run, Math.min(this.opts.drainPollMs, Math.max(0, deadline - now)), check);
    };
    this.after(shard, run, Math.max(0, Math.min(notBefore, deadline) - Date.now()), check);
  }

  /** The control plane's router.scrape_interval and scrape_timeout; 0 keeps what this agent has. */
  setScrape(intervalMs: number, timeoutMs: number): void {
    if (timeoutMs > 0) this.opts.scrapeTimeoutMs = timeoutMs;
    if (intervalMs <= 0 || intervalMs === this.opts.scrapeIntervalMs) return;
    this.opts.scrapeIntervalMs = intervalMs;
    // Scrape now and go on at the new pace, rather than after the old interval.
    for (const shard of this.shards.values()) {
      const next = shard.nextScrape;
      if (!next || !shard.timers.delete(next.timer)) continue;
      clearTimeout(next.timer);
      shard.nextScrape = undefined;
      next.run();
    }
  }

  /** The shard's one scraper, made on first use: the watch loop and drain polling share it. */
  private scraperFor(shard: Shard, launch: EngineLaunch, metricsPath: string): LoadScraper {
    shard.scraper ??= new LoadScraper(
      launch.probeHost,
      launch.port,
      metricsPath,
      launch.metricNames,
      () => this.opts.scrapeTimeoutMs,
    );
    return shard.scraper;
  }

  /** Running + waiting from the engine's metrics; 0 for an engine without metrics; undefined when the scrape fails. */
  private async inFlight(shard: Shard): Promise<number | undefined> {
    const launch = shard.launch;
    if (!launch || launch.metricsPath === null) return 0;
    try {
      const { reading, load } = await this.scraperFor(shard, launch, launch.metricsPath).scrape();
      shard.load = load;
      return reading.running + reading.waiting;
    } catch {
      return undefined;
    }
  }

  // ------------------------------------------------------------------- adoption

  private async adoptAll(): Promise<void> {
    const { records, problems } = readStateFile(this.statePath);
    for (const p of problems) this.log.warn("state file entry skipped", { problem: p });
    for (const rec of records) {
      try {
        await this.adopt(rec);
      } catch (err) {
        this.log.error("cannot adopt shard", { replica: rec.replicaId, error: errorMessage(err) });
      }
    }
    this.persist();
  }

  private async adopt(rec: ShardRecord): Promise<void> {
    const spec = rec.spec;
    const adapter = adapterFor(spec.engine);
    let launch: EngineLaunch | null = null;
    try {
      launch = adapter?.build(spec, { ...this.options.node, bin: this.options.bins?.[spec.engine] }) ?? null;
    } catch {
      launch = null;
    }
    const shard: Shard = {
      spec,
      launch,
      state: STATE_NAMES[rec.state],
      reason: "adopted",
      since: rec.sinceUnixMs,
      tail: [],
      proc: null,
      logPath: rec.logPath,
      failures: rec.failures,
      claimed: false,
      drainDeadline: rec.drainDeadlineUnixMs,
      timers: new Set(),
      run: 0,
    };
    this.shards.set(rec.replicaId, shard);
    const wasRunning = rec.state === "starting" || rec.state === "ready" || rec.state === "draining";
    let proc: EngineProcess | null = null;
    if (wasRunning && rec.pid !== null && processAlive(rec.pid, rec.startTime)) {
      if (cmdlineMentions(rec.pid, spec.model))
        proc = adoptEngine(rec.pid, rec.startTime, this.opts.adoptPollMs);
      else
        this.log.warn("not adopting: the process does not look like this engine", {
          replica: rec.replicaId,
          pid: rec.pid,
        });
    }

    if (!proc || !launch) {
      if (!wasRunning) {
        // It had failed before the agent went away; its restart is still due
        // (at the step it had reached, not one further).
        shard.failures = Math.max(0, rec.failures - 1);
        this.fail(shard, shard.state, `${rec.state} before the agent restarted`);
        return;
      }
      shard.tail = await readTail(rec.logPath, TAIL_LINES);
      if (rec.state === "draining") {
        shard.stopping = Promise.resolve();
        this.transition(shard, ShardState.STOPPED, "exited while the agent was down (was draining)");
        this.shards.delete(rec.replicaId);
        return;
      }
      const failed = rec.state === "starting" ? ShardState.FAILED_STARTUP : ShardState.FAILED_RUNNING;
      this.fail(shard, failed, "engine exited while the agent was down (exit code unknown)");
      return;
    }

    shard.proc = proc;
    const run = ++shard.run;
    this.log.info("adopted engine", { replica: rec.replicaId, pid: proc.pid, state: rec.state });
    if (rec.state === "draining") {
      this.transition(shard, ShardState.DRAINING, `adopted pid ${proc.pid}, still draining`);
      void proc.exited.then((info) => this.onExit(shard, run, info));
      this.watchReady(shard, run);
      this.watchDrain(shard, Date.now());
      return;
    }
    const url =
      launch.healthPath === null ? null : engineUrl(launch.probeHost, launch.port, launch.healthPath);
    if (url === null || (await probeHealth(url, this.opts.healthTimeoutMs))) {
      void proc.exited.then((info) => this.onExit(shard, run, info));
      this.markReady(shard, `adopted pid ${proc.pid} after agent restart`);
      return;
    }
    // Alive but not (or not yet) healthy: a fresh startup deadline, since how
    // long it has been loading is not something the agent could watch.
    this.transition(shard, ShardState.STARTING, `adopted pid ${proc.pid}, waiting for health`);
    this.superviseStartup(shard, run, this.startupDeadline(spec));
  }

  // ------------------------------------------------------------------- plumbing

  /** One command at a time per replica: two StartShards racing must not spawn two engines. */
  private serial<T>(replicaId: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.ops.get(replicaId) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const settled = next.then(
      () => undefined,
      () => undefined,
    );
    this.ops.set(replicaId, settled);
    void settled.then(() => {
      if (this.ops.get(replicaId) === settled) this.ops.delete(replicaId);
    });
    return next;
  }

  /**
   * A stop or drain for a shard this agent does not run is answered with
   * stopped anyway, so a control plane that believed otherwise converges
   * instead of waiting for a report that would never come.
   */
  private reportUnknown(replicaId: string, reason: string): void {
    this.options.onStatus?.(
      create(ShardStatusSchema, {
        replicaId,
        state: ShardState.STOPPED,
        reason: `${reason}: not running on this node`,
        sinceUnixMs: BigInt(Date.now()),
      }),
      "transition",
    );
  }

  private after(shard: Shard, run: number, ms: number, fn: () => unknown): Timer | undefined {
    if (run !== shard.run || this.closed) return undefined;
    const t = setTimeout(() => {
      shard.timers.delete(t);
      if (run === shard.run && !this.closed) void fn();
    }, ms);
    shard.timers.add(t);
    return t;
  }

  private clearTimers(shard: Shard): void {
    for (const t of shard.timers) clearTimeout(t);
    shard.timers.clear();
  }

  private transition(shard: Shard, state: ShardState, reason: string): void {
    if (this.closed) return;
    shard.state = state;
    shard.reason = reason;
    shard.since = Date.now();
    // Only failures carry the output tail; a stop keeps the exit code it saw.
    if (state !== ShardState.FAILED_RUNNING && state !== ShardState.FAILED_STARTUP) {
      shard.tail = [];
      if (state !== ShardState.STOPPED) shard.exit = undefined;
    }
    this.log.info("shard state", { replica: shard.spec.replicaId, state: shardStateName(state), reason });
    this.persist();
    this.options.onStatus?.(this.status(shard), "transition");
  }

  /** `withSpec` false for load reports, which go out every scrape and need not repeat the spec. */
  private status(s: Shard, withSpec = true): ShardStatus {
    return create(ShardStatusSchema, {
      replicaId: s.spec.replicaId,
      rank: s.spec.rank,
      state: s.state,
      reason: s.reason,
      exitCode: s.exit ?? 0,
      hasExitCode: s.exit !== undefined,
      outputTail: s.tail,
      load: s.load,
      sinceUnixMs: BigInt(s.since),
      pid: s.proc?.pid ?? 0,
      spec: withSpec ? s.spec : undefined,
      restartAtUnixMs: BigInt(s.restartAt ?? 0),
    });
  }

  private persist(): void {
    if (this.closed) return;
    const records: ShardRecord[] = [];
    for (const s of this.shards.values()) {
      const state = persistedName(s.state);
      if (!state) continue;
      records.push({
        replicaId: s.spec.replicaId,
        spec: s.spec,
        pid: s.proc?.pid ?? null,
        startTime: s.proc?.startTime ?? null,
        logPath: s.logPath,
        state,
        sinceUnixMs: s.since,
        failures: s.failures,
        drainDeadlineUnixMs: s.drainDeadline,
      });
    }
    try {
      writeStateFile(this.statePath, records);
    } catch (err) {
      this.log.error("cannot write state file", { path: this.statePath, error: errorMessage(err) });
    }
  }

  /** Keeps one previous log beside the current one (the run before a crash loop is often the telling one). */
  private rotateLog(path: string): void {
    try {
      renameSync(path, path.replace(/\.log$/, ".prev.log"));
    } catch {
      // No previous log.
    }
  }
}
