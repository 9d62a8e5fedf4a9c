import type { StartShard } from "../../proto/gen/agent/v1/agent_pb.ts";
import {
  type EngineAdapter,
  type EngineLaunch,
  fraction,
  gpuEnv,
  intFlag,
  listenHost,
  type NodeContext,
  probeHostFor,
  rendezvous,
  servesNoHttp,
  VLLM_METRICS,
  withApiKeyEnv,
  withSpecEnv,
} from "./adapter.ts";

/**
 * The flags after `serve`: shared with the sim engine, which takes vLLM's
 * command line so the same construction is exercised without a GPU.
 *
 * A replica over several nodes is one of two layouts (controlplane/catalog.ts):
 * tensor and pipeline parallel spanning the nodes (torch's rendezvous at
 * rank 0's `--master-port`), or, with `data_parallel` > 1, data-parallel
 * ranks spread over the nodes, each whole inside one node, meeting at rank
 * 0's `--data-parallel-address` and RPC port, as vLLM's data-parallel
 * deployment guide launches them. Either way the followers run headless
 * and rank 0 serves the API for the whole replica.
 */
export function vllmServeArgs(spec: StartShard, node: NodeContext): string[] {
  const host = listenHost(node);
  const args = [
    spec.model,
    "--host",
    host,
    "--port",
    String(spec.ports?.http ?? 0),
    "--served-model-name",
    spec.servedModelName || spec.model,
    "--tensor-parallel-size",
    String(spec.tensorParallel || 1),
    "--pipeline-parallel-size",
    String(spec.pipelineParallel || 1),
  ];
  if (spec.dataParallel > 1) args.push(...dataParallelArgs(spec, node));
  else if (spec.worldNodes > 1) {
    const head = rendezvous(spec, node);
    args.push(
      "--nnodes",
      String(spec.worldNodes),
      "--node-rank",
      String(spec.rank),
      "--master-addr",
      head.host,
    );
    if (head.port !== undefined) args.push("--master-port", String(head.port));
  }
  // Followers run only workers; the API server lives on rank 0.
  if (servesNoHttp(spec)) args.push("--headless");
  if (spec.gpuMemoryUtilization > 0) {
    args.push("--gpu-memory-utilization", fraction(spec.gpuMemoryUtilization));
  }
  args.push(...spec.args);
  return args;
}

/**
 * Rank 0's data-parallel ports, as placement handed them out (placement/ports.ts):
 * the RPC port, then the band vLLM keeps for its data-parallel group from
 * `VLLM_DP_MASTER_PORT`. Passed even on one node, where vLLM's defaults
 * would collide between two replicas.
 */
function dataParallelPorts(spec: StartShard): { rpc: number | undefined; master: number | undefined } {
  const head = spec.rank === 0 ? spec.ports : spec.peers.find((p) => p.rank === 0)?.ports;
  const [rpc, master] = head?.distInit ?? [];
  return { rpc, master };
}

function dataParallelArgs(spec: StartShard, node: NodeContext): string[] {
  const args = ["--data-parallel-size", String(spec.dataParallel)];
  const { rpc } = dataParallelPorts(spec);
  if (spec.worldNodes > 1) {
    const local = spec.dataParallel / spec.worldNodes;
    args.push("--data-parallel-size-local", String(local));
    if (spec.rank > 0) args.push("--data-parallel-start-rank", String(spec.rank * local));
    args.push("--data-parallel-address", rendezvous(spec, node).host);
  }
  if (rpc !== undefined) args.push("--data-parallel-rpc-port", String(rpc));
  return args;
}

/**
 * vLLM's default `--max-num-seqs` for its OpenAI server (and the sim
 * engine's). Newer releases pick larger ones on some GPUs; a profile that
 * names it in its engine args is exact.
 */
export const VLLM_DEFAULT_MAX_NUM_SEQS = 256;

/** The batch a replica runs at once: per data-parallel rank, so times their count. */
export function vllmMaxNumSeqs(spec: StartShard): number {
  const perRank = intFlag(spec.args, "--max-num-seqs") ?? VLLM_DEFAULT_MAX_NUM_SEQS;
  return perRank * Math.max(1, spec.dataParallel);
}

export const vllmAdapter: EngineAdapter = {
  engine: "vllm",
  defaultBin: "vllm",
  build(spec, node): EngineLaunch {
    const env = gpuEnv(spec, node);
    const dpMaster = spec.dataParallel > 1 ? dataParallelPorts(spec).master : undefined;
    if (dpMaster !== undefined) env.VLLM_DP_MASTER_PORT = String(dpMaster);
    if (spec.worldNodes > 1) {
      // With several addresses per host vLLM may pick the wrong one for the
      // workers to meet on; name it explicitly per node.
      env.VLLM_HOST_IP = node.advertiseAddress;
    }
    const headless = servesNoHttp(spec);
    return {
      argv: [node.bin || this.defaultBin, "serve", ...vllmServeArgs(spec, node)],
      env: withApiKeyEnv(withSpecEnv(env, spec), spec),
      probeHost: probeHostFor(listenHost(node)),
      port: spec.ports?.http ?? 0,
      // vLLM's /health is 200 when serving, 503 once the engine core died,
      // connection refused while loading.
      healthPath: headless ? null : "/health",
      metricsPath: headless ? null : "/metrics",
      metricNames: VLLM_METRICS,
      maxNumSeqs: vllmMaxNumSeqs(spec),
      capacityProbe: null,
      apiKey: spec.engineApiKey,
    };
  },
};
