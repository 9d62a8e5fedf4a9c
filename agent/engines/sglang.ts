import { capacityFromServerInfo, SGLANG_SERVER_INFO_PATHS } from "../../common/sglang-server-info.ts";
import type { StartShard } from "../../proto/gen/agent/v1/agent_pb.ts";
import {
  type EngineAdapter,
  type EngineLaunch,
  fraction,
  gpuEnv,
  hasFlag,
  intFlag,
  listenHost,
  type NodeContext,
  probeHostFor,
  rendezvous,
  SGLANG_METRICS,
  servesNoHttp,
  withSpecEnv,
} from "./adapter.ts";

export function sglangArgs(spec: StartShard, node: NodeContext): string[] {
  const args = [
    "-m",
    "sglang.launch_server",
    "--model-path",
    spec.model,
    "--host",
    listenHost(node),
    "--port",
    String(spec.ports?.http ?? 0),
    // SGLang's --tp counts every GPU of the replica across all nodes; the
    // spec's tensor_parallel is that same replica-wide size.
    "--tp",
    String(spec.tensorParallel || 1),
  ];
  if (spec.pipelineParallel > 1) args.push("--pp-size", String(spec.pipelineParallel));
  if (spec.dataParallel > 1) args.push("--dp-size", String(spec.dataParallel));
  if (spec.worldNodes > 1) {
    args.push("--nnodes", String(spec.worldNodes), "--node-rank", String(spec.rank));
  }
  const head = rendezvous(spec, node);
  // Passed whenever a port was assigned, single node included: unset, SGLang
  // picks port+233 and the ports after it, outside what placement reserved.
  if (head.port !== undefined) args.push("--dist-init-addr", `${head.host}:${head.port}`);
  args.push("--served-model-name", spec.servedModelName || spec.model);
  if (spec.gpuMemoryUtilization > 0) {
    args.push("--mem-fraction-static", fraction(spec.gpuMemoryUtilization));
  }
  // SGLang takes its key from the command line only; the agent blanks it
  // out of the lines it logs and reports (adapter.ts redacted).
  if (spec.engineApiKey && !servesNoHttp(spec)) args.push("--api-key", spec.engineApiKey);
  args.push("--enable-metrics", ...spec.args);
  return args;
}

/**
 * The batch an explicit --max-running-requests gives the replica: each
 * data-parallel rank's scheduler takes all of it, unless DP attention
 * splits it between them (scheduler.py, max_running_requests).
 */
export function sglangMaxRunning(spec: StartShard): number | undefined {
  const flag = intFlag(spec.args, "--max-running-requests");
  if (flag === undefined) return undefined;
  return hasFlag(spec.args, "--enable-dp-attention") ? flag : flag * Math.max(1, spec.dataParallel);
}

export const sglangAdapter: EngineAdapter = {
  engine: "sglang",
  defaultBin: "python",
  build(spec, node): EngineLaunch {
    const follower = servesNoHttp(spec);
    return {
      argv: [node.bin || this.defaultBin, ...sglangArgs(spec, node)],
      env: withSpecEnv(gpuEnv(spec, node), spec),
      probeHost: probeHostFor(listenHost(node)),
      port: spec.ports?.http ?? 0,
      healthPath: follower ? null : "/health",
      // SGLang's /health generates a token and looks for any output a
      // second later, and answers 503 itself after SGLANG_HEALTH_CHECK_TIMEOUT
      // (20 s) without one: its own verdict, which a shorter bound would
      // pre-empt on every busy engine (http_server.py, health_generate).
      healthTimeoutMs: 25_000,
      metricsPath: follower ? null : "/metrics",
      metricNames: SGLANG_METRICS,
      // SGLang sizes its batch from memory at start and exports no figure
      // for it in its metrics: an explicit --max-running-requests is known
      // at launch, and the batch it really runs (which that flag only caps)
      // is in its server info once it serves.
      maxNumSeqs: sglangMaxRunning(spec),
      capacityProbe: follower ? null : { paths: SGLANG_SERVER_INFO_PATHS, read: capacityFromServerInfo },
      apiKey: spec.engineApiKey,
    };
  },
};
