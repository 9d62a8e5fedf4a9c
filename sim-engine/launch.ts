/**
 * What every persona of the sim engine does to run: size the simulated
 * GPUs, build the engine cores and the HTTP server, listen, and serve until
 * a signal; or, on a rank that serves no API, just live until one.
 */
import { createLogger, errorMessage, type Logger } from "../common/log.ts";
import { EngineCore } from "./engine-core.ts";
import { FaultPlan } from "./faults.ts";
import { FlagError, type SimEngineFlags } from "./flags.ts";
import {
  H100_80GB_LLAMA_3_1_8B_MEMORY,
  H100_LLAMA_3_1_8B,
  kvBlocksFor,
  type LatencyParams,
  scaleForParallelism,
} from "./latency-model.ts";
import type { Persona } from "./persona.ts";
import { RequestTrace } from "./request-trace.ts";
import { Runner } from "./runner.ts";
import { SimServer } from "./server.ts";

const log = createLogger({ component: "sim-engine" });

export interface EngineSetup {
  numBlocks: number;
  maxModelLen: number;
  latency: LatencyParams;
  gpus: number;
}

/** Sizes the simulated GPU(s) like vLLM's startup profiling would. */
export function engineSetup(f: SimEngineFlags): EngineSetup {
  const gpus = f.tensorParallelSize * f.pipelineParallelSize;
  const memory = { ...H100_80GB_LLAMA_3_1_8B_MEMORY, gpuMemoryGiB: f.sim.gpuMemoryGiB };
  const numBlocks = f.sim.kvBlocks ?? kvBlocksFor(memory, f.gpuMemoryUtilization, gpus, f.blockSize);
  if (numBlocks < 1) {
    throw new FlagError(
      `no memory left for the KV cache: ${f.sim.gpuMemoryGiB} GiB × ${f.gpuMemoryUtilization} × ${gpus} GPU(s) does not hold the weights; raise --gpu-memory-utilization or --sim-gpu-memory-gib`,
    );
  }
  const capacity = numBlocks * f.blockSize;
  let maxModelLen = f.maxModelLen ?? 131_072;
  if (maxModelLen > capacity) {
    if (f.maxModelLen !== undefined) {
      // vLLM refuses to start here too: one sequence of max length must fit.
      throw new FlagError(
        `--max-model-len ${maxModelLen} is larger than the KV cache can hold (${capacity} tokens = ${numBlocks} blocks × ${f.blockSize}); lower it or add KV blocks`,
      );
    }
    maxModelLen = capacity;
  }
  const base: LatencyParams = {
    ...H100_LLAMA_3_1_8B,
    ...(f.sim.weightsReadMs !== undefined ? { weightsReadMs: f.sim.weightsReadMs } : {}),
    ...(f.sim.prefillUsPerToken !== undefined ? { computeUsPerToken: f.sim.prefillUsPerToken } : {}),
    ...(f.sim.perSeqUs !== undefined ? { perSequenceUs: f.sim.perSeqUs } : {}),
  };
  return {
    numBlocks,
    maxModelLen,
    latency: scaleForParallelism(base, f.tensorParallelSize, f.pipelineParallelSize),
    gpus,
  };
}

/** The --sim-trace file, opened; "failed" (said on stderr) when it cannot be. */
export function openTrace(flags: SimEngineFlags): RequestTrace | undefined | "failed" {
  if (flags.sim.trace === undefined) return undefined;
  const file = flags.sim.trace;
  try {
    return new RequestTrace(file, (err) =>
      log.error("cannot write the request trace", { file, err: errorMessage(err) }),
    );
  } catch (err) {
    process.stderr.write(`sim-engine: --sim-trace: cannot open ${file}: ${errorMessage(err)}\n`);
    return "failed";
  }
}

/** The engine: one core per data-parallel rank, stepped at --sim-speed; `logTo` is the persona's log. */
export function engineRunner(flags: SimEngineFlags, setup: EngineSetup, logTo: Logger): Runner {
  return new Runner(engineCores(flags, setup), flags.sim.speed, flags.sim.slowTokenMs, (err) =>
    logTo.error("response writer failed", { err: errorMessage(err) }),
  );
}

function engineCores(flags: SimEngineFlags, setup: EngineSetup): EngineCore[] {
  return Array.from(
    { length: flags.dataParallelSize },
    () =>
      new EngineCore({
        maxNumSeqs: flags.maxNumSeqs,
        maxNumBatchedTokens: flags.maxNumBatchedTokens,
        numBlocks: setup.numBlocks,
        blockSize: flags.blockSize,
        prefixCaching: flags.enablePrefixCaching,
        latency: setup.latency,
      }),
  );
}

export function simServer(
  flags: SimEngineFlags,
  setup: EngineSetup,
  runner: Runner,
  trace: RequestTrace | undefined,
  persona?: Persona,
): SimServer {
  return new SimServer({
    ...(trace ? { trace } : {}),
    ...(persona ? { persona } : {}),
    rootModel: flags.model,
    servedModelNames: flags.servedModelNames,
    maxModelLen: setup.maxModelLen,
    seed: flags.seed,
    outputLen: flags.sim.outputLen,
    promptTokensDetails: flags.enablePromptTokensDetails,
    autoToolChoice: flags.enableAutoToolChoice,
    apiKeys: flags.apiKeys,
    quirks: flags.sim.quirks,
    keepAliveMs: flags.httpKeepAliveSeconds * 1000,
    faults: new FaultPlan({
      seed: flags.seed,
      failRate: flags.sim.failRate,
      hangPhase: flags.sim.hangPhase,
      ...(flags.sim.crashAfter !== undefined ? { crashAfter: flags.sim.crashAfter } : {}),
      ...(flags.sim.hangAfter !== undefined ? { hangAfter: flags.sim.hangAfter } : {}),
    }),
    runner,
    log,
  });
}

/** Listens on --host and --port; the port bound (--port 0 picks one). */
export async function listen(server: SimServer, flags: SimEngineFlags): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.http.once("error", reject);
    server.http.listen(flags.port, flags.host, () => resolve());
  }).catch((err) => {
    throw new Error(`cannot listen on ${flags.host}:${flags.port}: ${errorMessage(err)}`);
  });
  const addr = server.http.address();
  return typeof addr === "object" && addr ? addr.port : flags.port;
}

/** Serves until SIGTERM or SIGINT, then stops the runner, cuts the connections and flushes the trace. */
export function untilSignal(
  server: SimServer,
  runner: Runner,
  readyTimer: ReturnType<typeof setTimeout>,
  trace: RequestTrace | undefined,
): Promise<number> {
  return new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      log.info("sim engine stopping", { signal });
      clearTimeout(readyTimer);
      runner.stop();
      server.http.close();
      server.http.closeAllConnections();
      // The cut connections' close events (and their trace lines) come on
      // the next turns; flush after them.
      setImmediate(() => void (trace?.close() ?? Promise.resolve()).then(() => resolve(0)));
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
}

/**
 * A non-zero rank of a multi-node replica: vLLM's headless worker, or
 * SGLang's rank that runs schedulers only. It serves no API and just lives
 * until SIGTERM or SIGINT; `fields` say who it is in the log.
 */
export function headless(fields: Record<string, unknown>): Promise<number> {
  const keepAlive = setInterval(() => {}, 1 << 30);
  const stopped = new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      log.info("sim engine headless worker stopping", { signal });
      clearInterval(keepAlive);
      resolve(0);
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
  // Said only once the signals are ours: whoever waits for this line may
  // stop the worker the moment it reads it, and a SIGTERM before the
  // handler would kill it outright instead of a clean exit 0.
  log.info("sim engine headless worker", fields);
  return stopped;
}
