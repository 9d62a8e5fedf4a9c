/**
 * `llmgw sim-engine serve MODEL ...`: a CPU stand-in for `vllm serve`, and
 * `llmgw sim-engine -m sglang.launch_server ...`: the same engine playing
 * SGLang (sglang-main.ts). See docs/sim-engine.md for flags, the
 * performance model and the faults.
 */
import { createLogger } from "../common/log.ts";
import { FlagError, parseServeArgs, type SimEngineFlags, USAGE } from "./flags.ts";
import {
  type EngineSetup,
  engineRunner,
  engineSetup,
  headless,
  listen,
  openTrace,
  simServer,
  untilSignal,
} from "./launch.ts";
import { sglangMain } from "./sglang-main.ts";

const log = createLogger({ component: "sim-engine" });

export async function main(argv: string[]): Promise<number | undefined> {
  // `python -m sglang.launch_server ...` as test/bin/sglang passes it on.
  if (argv[0] === "-m") return sglangMain(argv.slice(1));
  const parsed = parseCommand(argv);
  if (typeof parsed === "number") return parsed;
  const { flags, setup } = parsed;
  for (const flag of flags.ignored) log.warn("flag accepted but not simulated", { flag });

  if (flags.headless || flags.nodeRank > 0) {
    return headless({
      node_rank: flags.nodeRank,
      nnodes: flags.nnodes,
      master_addr: flags.masterAddr,
      master_port: flags.masterPort,
    });
  }

  const trace = openTrace(flags);
  if (trace === "failed") return 2;
  const runner = engineRunner(flags, setup, log);
  const server = simServer(flags, setup, runner, trace);
  const port = await listen(server, flags);
  const readyTimer = setTimeout(() => {
    server.markReady();
    log.info("sim engine ready", { port });
  }, flags.sim.startupSeconds * 1000);
  // The signals are ours before the line that says so: whoever waits for
  // it may stop the engine the moment it reads it.
  const done = untilSignal(server, runner, readyTimer, trace);
  log.info("sim engine listening", {
    host: flags.host,
    port,
    model: flags.model,
    served_model_names: flags.servedModelNames,
    kv_blocks: setup.numBlocks,
    block_size: flags.blockSize,
    max_model_len: setup.maxModelLen,
    max_num_seqs: flags.maxNumSeqs,
    data_parallel_size: flags.dataParallelSize,
    gpus_per_replica: setup.gpus,
    speed: flags.sim.speed,
    startup_seconds: flags.sim.startupSeconds,
    // How many, never which: the keys stay out of the log.
    api_keys: flags.apiKeys.length,
  });
  return done;
}

/** The subcommand and its flags, or the exit code when there is nothing to serve (help, a bad flag). */
function parseCommand(argv: string[]): { flags: SimEngineFlags; setup: EngineSetup } | number {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    process.stdout.write(USAGE);
    return sub === undefined ? 2 : 0;
  }
  if (sub !== "serve") {
    process.stderr.write(`sim-engine: unknown subcommand "${sub}"\n\n${USAGE}`);
    return 2;
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    process.stdout.write(USAGE);
    return 0;
  }
  try {
    const flags = parseServeArgs(rest, process.env);
    return { flags, setup: engineSetup(flags) };
  } catch (err) {
    if (!(err instanceof FlagError)) throw err;
    process.stderr.write(`sim-engine: ${err.message}\n\n${USAGE}`);
    return 2;
  }
}
