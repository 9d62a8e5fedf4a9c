/**
 * The agent's engines: one runner per shard (shard/runner.ts), each driving
 * the pure lifecycle (shard/lifecycle.ts). The supervisor holds the set:
 * commands from the control plane, one at a time per replica; the state
 * file; adoption of what a previous agent left running; the orphan grace.
 *
 * It never talks to the control plane itself: the stream client forwards
 * what `onStatus` and `onLoad` emit and calls start/stop/drain for what it
 * receives. Engines are detached, so closing the supervisor (agent exit)
 * leaves them serving; the next supervisor on the same state dir adopts them.
 */
import { join } from "node:path";
import { createLogger, errorMessage, type Logger } from "../common/log.ts";
import { ownerOnlyDir } from "../common/owner-only.ts";
import type { ShardLoad, StartShard } from "../proto/gen/agent/v1/agent_pb.ts";
import { groupMembers } from "./engine-process.ts";
import type { NodeContext } from "./engines/adapter.ts";
import type { EngineBins } from "./engines/registry.ts";
import type { GpuFact } from "./engines/validate.ts";
import { trimLog } from "./output-tail.ts";
import { adoptShard } from "./shard/adoption.ts";
import { begin } from "./shard/lifecycle.ts";
import type { ScrapeSettings } from "./shard/load-watch.ts";
import { DEFAULT_POLICY, type LifecyclePolicy, type RestartPolicy } from "./shard/policy.ts";
import type { ShardReport } from "./shard/record.ts";
import { type RunnerContext, ShardRunner, type SupervisorStats } from "./shard/runner.ts";
import { readStateFile, STATE_FILE_NAME, writeStateFile } from "./state-file.ts";

export interface SupervisorOptions {
  stateDir: string;
  node: Omit<NodeContext, "bin">;
  /** Executable per engine (`--vllm-bin`, `--sglang-bin`); the sim engine is this llmgw itself (engines/sim.ts). */
  bins?: EngineBins;
  /** Every change of a shard's state. */
  onStatus?: (status: ShardReport) => void;
  /** Every scrape of a serving engine's load. */
  onLoad?: (replicaId: string, rank: number, load: ShardLoad) => void;
  /** Current GPUs with free memory, for validation; omitted, GPU checks are skipped. */
  gpus?: () => GpuFact[] | Promise<GpuFact[]>;
  restart?: Partial<RestartPolicy>;
  healthIntervalMs?: number;
  healthTimeoutMs?: number;
  /** 0 failures disables liveness polling. */
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
  drainSettleMs?: number;
  /** An engine log over this size is trimmed to its tail (checked every `logCheckMs`). */
  maxLogBytes?: number;
  logCheckMs?: number;
  logger?: Logger;
}

function safeFileName(id: string): string {
  return id.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 200) || "shard";
}

export class Supervisor {
  private readonly runners = new Map<string, ShardRunner>();
  private readonly ops = new Map<string, Promise<unknown>>();
  private readonly ctx: RunnerContext;
  readonly stats: SupervisorStats = {
    restarts: 0,
    scrapeErrors: 0,
    adopted: 0,
    orphanGrace: "not_begun",
    orphansStopped: 0,
  };
  private readonly scrape: ScrapeSettings;
  private readonly log: Logger;
  private readonly statePath: string;
  private readonly logDir: string;
  private orphanTimer: ReturnType<typeof setTimeout> | undefined;
  private logTimer: ReturnType<typeof setInterval> | undefined;
  /** While adopting: the state file is written once, when every record has been read. */
  private opening = true;
  private closed = false;
  /** Set by `shutdown()`: nothing new is launched, not even a restart after backoff. */
  private shuttingDown = false;

  private constructor(private readonly options: SupervisorOptions) {
    const d = DEFAULT_POLICY;
    const o = options;
    const policy: LifecyclePolicy = {
      restart: { ...d.restart, ...o.restart },
      healthIntervalMs: o.healthIntervalMs ?? d.healthIntervalMs,
      livenessIntervalMs: o.livenessIntervalMs ?? d.livenessIntervalMs,
      livenessFailures: o.livenessFailures ?? d.livenessFailures,
      defaultStartupDeadlineMs: o.defaultStartupDeadlineMs ?? d.defaultStartupDeadlineMs,
      defaultStopGraceMs: o.defaultStopGraceMs ?? d.defaultStopGraceMs,
      drainPollMs: o.drainPollMs ?? d.drainPollMs,
      drainSettleMs: o.drainSettleMs ?? d.drainSettleMs,
    };
    this.scrape = { intervalMs: o.scrapeIntervalMs ?? 2_000, timeoutMs: o.scrapeTimeoutMs ?? 1_000 };
    this.log = o.logger ?? createLogger({ component: "supervisor" });
    this.statePath = join(o.stateDir, STATE_FILE_NAME);
    this.logDir = join(o.stateDir, "logs");
    this.ctx = {
      policy,
      node: o.node,
      bins: o.bins,
      stateDir: o.stateDir,
      gpus: o.gpus,
      healthTimeoutMs: o.healthTimeoutMs ?? 1_000,
      scrape: this.scrape,
      log: this.log,
      now: Date.now,
      mayLaunch: () => !this.closed && !this.shuttingDown,
      report: (status) => {
        if (!this.closed) o.onStatus?.(status);
      },
      load: (id, rank, load) => {
        if (!this.closed) o.onLoad?.(id, rank, load);
      },
      stats: this.stats,
      persist: () => this.persist(),
      forget: (runner) => {
        if (this.runners.get(runner.id) === runner) this.runners.delete(runner.id);
      },
    };
  }

  /** Opens the state dir and adopts every engine a previous agent left running. */
  static async open(options: SupervisorOptions): Promise<Supervisor> {
    const sup = new Supervisor(options);
    ownerOnlyDir(sup.logDir, sup.log);
    const { records, problems } = readStateFile(sup.statePath);
    for (const p of problems) sup.log.warn("state file entry skipped", { problem: p });
    for (const rec of records) {
      try {
        const runner = await adoptShard(sup.ctx, rec, options.adoptPollMs ?? 1_000);
        if (runner.phaseName !== "gone") sup.runners.set(runner.id, runner);
      } catch (err) {
        sup.log.error("cannot adopt shard", { replica: rec.replicaId, error: errorMessage(err) });
      }
    }
    sup.opening = false;
    sup.persist();
    const maxLogBytes = options.maxLogBytes ?? 256 * 1024 * 1024;
    sup.logTimer = setInterval(() => {
      for (const r of sup.runners.values()) if (r.proc) void trimLog(r.logPath, maxLogBytes);
    }, options.logCheckMs ?? 60_000);
    sup.logTimer.unref();
    return sup;
  }

  /**
   * Starts a shard, or claims it when this exact replica generation already
   * runs (a re-sent StartShard after an agent or control plane restart is an
   * adoption, not a restart). A failed one with no restart coming is
   * relaunched; a different generation replaces the old one.
   */
  start(spec: StartShard): Promise<ShardReport> {
    return this.serial(spec.replicaId, () => this.startNow(spec));
  }

  private async startNow(spec: StartShard): Promise<ShardReport> {
    let current = this.runners.get(spec.replicaId);
    if (current) {
      await current.until((r) => r.phaseName !== "terminating");
      current = this.runners.get(spec.replicaId);
    }
    if (current) {
      if (current.life.spec.generation === spec.generation && current.life.spec.rank === spec.rank) {
        if (current.phaseName === "failed") {
          current.dispatch({ kind: "launch" });
          await current.launching;
        } else current.dispatch({ kind: "claim", report: true });
        return current.report();
      }
      // The old generation reports its stop: the control plane waits for it to free the GPUs.
      current.dispatch({ kind: "stop", reason: `replaced by generation ${spec.generation}` });
      await current.ended();
    }
    const first = begin(spec, 0, Date.now());
    const runner = new ShardRunner(
      this.ctx,
      first.life,
      join(this.logDir, `${safeFileName(spec.replicaId)}.log`),
    );
    this.runners.set(spec.replicaId, runner);
    runner.run(first.effects);
    await runner.launching;
    return runner.report();
  }

  /** Marks an adopted shard as wanted without a StartShard (e.g. listed in the control plane's ack). */
  claim(replicaId: string): boolean {
    const r = this.runners.get(replicaId);
    r?.dispatch({ kind: "claim", report: false });
    return r !== undefined;
  }

  /** SIGTERM to the engine's group, SIGKILL after the grace; reports stopped and forgets the shard. */
  stop(replicaId: string, reason = "stop requested", graceMs?: number): Promise<void> {
    return this.serial(replicaId, async () => {
      const r = this.runners.get(replicaId);
      if (!r) return this.reportUnknown(replicaId, reason);
      r.dispatch({ kind: "stop", reason, graceMs });
      await r.ended();
    });
  }

  /**
   * Reports draining at once (the edge stops routing to it), then stops the
   * engine when nothing is running or waiting in it, or at the deadline.
   */
  drain(replicaId: string, deadlineMs: number): Promise<void> {
    return this.serial(replicaId, async () => {
      const r = this.runners.get(replicaId);
      if (!r) return this.reportUnknown(replicaId, "drain requested");
      r.dispatch({ kind: "drain", deadlineMs });
      // One not yet serving is stopped instead; the command is done when it is.
      await r.until((x) => x.phaseName !== "terminating");
    });
  }

  /** Every shard this agent runs or is about to restart, for Register. */
  list(): ShardReport[] {
    return [...this.runners.values()].map((r) => r.report());
  }

  get(replicaId: string): ShardReport | undefined {
    return this.runners.get(replicaId)?.report();
  }

  /** PIDs of every engine process and the workers they forked, for telling our VRAM from foreign VRAM. */
  enginePids(): Set<number> {
    const leaders = new Set<number>();
    for (const r of this.runners.values()) if (r.proc?.pid) leaders.add(r.proc.pid);
    return groupMembers(leaders);
  }

  /**
   * Starts the clock for adopted engines nobody claims. Call it once the
   * control plane has accepted this agent's Register, not at agent start: an
   * agent that restarts while the control plane is down must not stop every
   * engine on the node (engines never depend on the control plane).
   */
  beginOrphanGrace(graceMs = this.options.orphanGraceMs ?? 60_000): void {
    if (this.orphanTimer) return;
    this.stats.orphanGrace = "running";
    this.orphanTimer = setTimeout(() => {
      const unclaimed = [...this.runners.values()].filter((r) => !r.life.claimed);
      this.stats.orphanGrace = "over";
      this.stats.orphansStopped += unclaimed.length;
      this.log.info("orphan grace over", { unclaimed: unclaimed.map((r) => r.id) });
      for (const r of unclaimed) r.dispatch({ kind: "orphan-grace-over", graceMs });
    }, graceMs);
    this.orphanTimer.unref();
  }

  /** The control plane's router.scrape_interval and scrape_timeout; 0 keeps what this agent has. */
  setScrape(intervalMs: number, timeoutMs: number): void {
    if (timeoutMs > 0) this.scrape.timeoutMs = timeoutMs;
    if (intervalMs <= 0 || intervalMs === this.scrape.intervalMs) return;
    this.scrape.intervalMs = intervalMs;
    for (const r of this.runners.values()) r.retune();
  }

  /** Stops every engine (tests; `shutdown()` for an agent that exits). */
  async stopAll(reason = "agent stopping engines"): Promise<void> {
    await Promise.all(
      [...this.runners.values()].map((r) => {
        r.dispatch({ kind: "stop", reason });
        return r.ended();
      }),
    );
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
    this.persist();
    // From here on nothing may write the state file: the next agent owns it.
    this.closed = true;
    for (const r of this.runners.values()) r.close();
  }

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
    this.ctx.report({
      replicaId,
      rank: 0,
      state: "stopped",
      reason: `${reason}: not running on this node`,
      since: Date.now(),
      tail: [],
      pid: 0,
    });
  }

  private persist(): void {
    if (this.closed || this.opening) return;
    const records = [...this.runners.values()].flatMap((r) => r.record() ?? []);
    try {
      writeStateFile(this.statePath, records);
    } catch (err) {
      this.log.error("cannot write state file", { path: this.statePath, error: errorMessage(err) });
    }
  }
}
