/**
 * `llmgw sim-engine -m sglang.launch_server [SGLang flags] [--sim-* flags]`:
 * the sim engine as SGLang (docs/sim-engine.md, "The SGLang persona"). As
 * SGLang does, it sizes itself, loads (--sim-startup-seconds, with nothing
 * listening: SGLang loads its weights before uvicorn binds), then serves;
 * a non-zero rank of a multi-node replica runs "schedulers only" and serves
 * no HTTP until it is signalled.
 */
import { createLogger } from "../common/log.ts";
import { FlagError } from "./flags.ts";
import { engineRunner, engineSetup, headless, listen, openTrace, simServer, untilSignal } from "./launch.ts";
import { parseSglangArgs, SGLANG_USAGE } from "./sglang-flags.ts";
import { SglangRequestMetrics } from "./sglang-metrics.ts";
import { SglangPersona } from "./sglang-persona.ts";
import { sglangSizing, simFlagsOf } from "./sglang-sizing.ts";

const log = createLogger({ component: "sim-engine", persona: "sglang" });

const MODULE = "sglang.launch_server";

/** The flags and everything sized from them, or the exit code when there is nothing to serve. */
function parseCommand(argv: readonly string[]) {
  const [module, ...rest] = argv;
  if (module !== MODULE) {
    process.stderr.write(
      `sim-engine: -m: only ${MODULE} is served, got "${module ?? ""}"\n\n${SGLANG_USAGE}`,
    );
    return 2;
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    process.stdout.write(SGLANG_USAGE);
    return 0;
  }
  try {
    const flags = parseSglangArgs(rest);
    const sizing = sglangSizing(flags);
    const sim = simFlagsOf(flags, sizing);
    return { flags, sizing, sim, setup: engineSetup(sim) };
  } catch (err) {
    if (!(err instanceof FlagError)) throw err;
    process.stderr.write(`sim-engine: ${err.message}\n\n${SGLANG_USAGE}`);
    return 2;
  }
}

/** The words after `llmgw sim-engine -m`. */
export async function sglangMain(argv: readonly string[]): Promise<number> {
  const parsed = parseCommand(argv);
  if (typeof parsed === "number") return parsed;
  const { flags, sizing, sim, setup } = parsed;
  for (const flag of flags.ignored) log.warn("flag accepted but not simulated", { flag });
  if (flags.nnodes > 1 && flags.nodeRank > 0) {
    return headless({ node_rank: flags.nodeRank, nnodes: flags.nnodes, dist_init_addr: flags.distInitAddr });
  }
  const trace = openTrace(sim);
  if (trace === "failed") return 2;
  const runner = engineRunner(sim, setup, log);
  const persona = new SglangPersona({
    flags,
    sizing,
    runner,
    requests: new SglangRequestMetrics(),
    log,
    env: process.env,
  });
  const server = simServer(sim, setup, runner, trace, persona);
  let loaded: () => void = () => {};
  const loading = new Promise<"loaded">((resolve) => {
    loaded = () => resolve("loaded");
  });
  const startup = setTimeout(() => loaded(), sim.sim.startupSeconds * 1000);
  const done = untilSignal(server, runner, startup, trace);
  if ((await Promise.race([loading, done])) !== "loaded") return done;
  const port = await listen(server, sim);
  server.markReady();
  log.info("sim engine listening", {
    host: flags.host,
    port,
    model_path: flags.modelPath,
    served_model_name: flags.servedModelName,
    max_total_num_tokens: sizing.maxTotalNumTokens,
    max_running_requests: sizing.maxRunningRequests,
    context_len: sizing.contextLength,
    page_size: flags.pageSize,
    dp_size: flags.dpSize,
    speed: sim.sim.speed,
  });
  return done;
}
