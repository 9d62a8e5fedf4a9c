import { adoptEngine, cmdlineMentions, type EngineProcess, processAlive } from "../engine-process.ts";
import { engineUrl, probeHealth } from "../health-probe.ts";
import { reportedTail } from "../output-tail.ts";
import type { ShardRecord } from "../state-file.ts";
import { fromRecord } from "./record.ts";
import { buildLaunch, type RunnerContext, ShardRunner } from "./runner.ts";

/**
 * Takes over a shard a previous agent on this state dir left behind. The
 * record names a PID and its /proc start time; the process is adopted only
 * when it is still that process and its command line names the model (a PID
 * alone may have been reused, or the file tampered with). What became of
 * it — alive and healthy, alive and loading, gone — is the lifecycle's to
 * decide (`found` / `not-found`).
 */
export async function adoptShard(ctx: RunnerContext, rec: ShardRecord, pollMs: number): Promise<ShardRunner> {
  const life = fromRecord({
    spec: rec.spec,
    state: rec.state,
    since: rec.sinceUnixMs,
    failures: rec.failures,
    drainDeadlineAt: rec.drainDeadlineUnixMs,
  });
  const runner = new ShardRunner(ctx, life, rec.logPath);
  let launch: ReturnType<typeof buildLaunch>;
  try {
    launch = buildLaunch(ctx, life);
  } catch {
    launch = undefined;
  }
  const wasRunning = rec.state === "starting" || rec.state === "ready" || rec.state === "draining";
  let proc: EngineProcess | null = null;
  if (wasRunning && rec.pid !== null && processAlive(rec.pid, rec.startTime)) {
    if (cmdlineMentions(rec.pid, rec.spec.model)) proc = adoptEngine(rec.pid, rec.startTime, pollMs);
    else
      ctx.log.warn("not adopting: the process does not look like this engine", {
        replica: rec.replicaId,
        pid: rec.pid,
      });
  }
  if (!proc || !launch) {
    const tail = wasRunning ? await reportedTail(rec.logPath, rec.spec.engineApiKey) : [];
    runner.dispatch({ kind: "not-found", tail });
    return runner;
  }
  runner.attach(proc, launch);
  ctx.stats.adopted++;
  ctx.log.info("adopted engine", { replica: rec.replicaId, pid: proc.pid, state: rec.state });
  const healthUrl =
    launch.healthPath === null ? null : engineUrl(launch.probeHost, launch.port, launch.healthPath);
  const healthy =
    rec.state === "draining" ||
    healthUrl === null ||
    (await probeHealth(healthUrl, launch.healthTimeoutMs ?? ctx.healthTimeoutMs));
  runner.dispatch({ kind: "found", pid: proc.pid, healthUrl, healthy });
  return runner;
}
