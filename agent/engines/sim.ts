import { fileURLToPath } from "node:url";
import {
  type EngineAdapter,
  type EngineLaunch,
  listenHost,
  probeHostFor,
  servesNoHttp,
  VLLM_METRICS,
  withApiKeyEnv,
  withSpecEnv,
} from "./adapter.ts";
import { vllmMaxNumSeqs, vllmServeArgs } from "./vllm.ts";

/** bin/llmgw.mjs of this checkout: the sim engine is a subcommand of llmgw itself. */
export const LLMGW_ENTRY = fileURLToPath(new URL("../../bin/llmgw.mjs", import.meta.url));

/**
 * The sim engine speaks vLLM's command line, API and metric names, so it
 * gets vLLM's arguments — only the executable differs. It is run on the
 * agent's own Node (process.execPath) rather than through PATH, because the
 * host's `node` may be too old to run llmgw. No CUDA variables: it touches no
 * GPU, and a test fleet must not look as if it pinned real devices.
 */
export const simAdapter: EngineAdapter = {
  engine: "sim",
  defaultBin: LLMGW_ENTRY,
  build(spec, node): EngineLaunch {
    const entry = node.bin || this.defaultBin;
    const headless = servesNoHttp(spec);
    return {
      argv: [process.execPath, entry, "sim-engine", "serve", ...vllmServeArgs(spec, node)],
      env: withApiKeyEnv(withSpecEnv({}, spec), spec),
      probeHost: probeHostFor(listenHost(node)),
      port: spec.ports?.http ?? 0,
      healthPath: headless ? null : "/health",
      metricsPath: headless ? null : "/metrics",
      metricNames: VLLM_METRICS,
      maxNumSeqs: vllmMaxNumSeqs(spec),
      capacityProbe: null,
      apiKey: spec.engineApiKey,
    };
  },
};
