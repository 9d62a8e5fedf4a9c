/**
 * Checks a shard spec against what this node actually has, before anything
 * is launched: an engine that rejects a profile does so only after minutes of
 * loading weights, and then with one error at a time. This reports every
 * problem at once, in words an operator can act on.
 */
import type { StartShard } from "../../proto/gen/agent/v1/agent_pb.ts";
import type { EngineLaunch } from "./adapter.ts";

export interface GpuFact {
  index: number;
  memoryTotalMib: number;
  memoryFreeMib: number;
}

export interface LaunchFacts {
  /** The node's GPUs now, free memory after foreign users; null when unknown (GPU checks are skipped). */
  gpus: GpuFact[] | null;
  /** Which of `portsToBind()` something else already holds. */
  portsInUse: number[];
  /** The executable as given and whether it resolved to something runnable. */
  binary: { name: string; found: boolean };
}

export type ProblemCode =
  | "bad_spec"
  | "unknown_engine"
  | "parallel_mismatch"
  | "gpu_missing"
  | "gpu_memory"
  | "port_in_use"
  | "binary_not_found";

export interface Problem {
  code: ProblemCode;
  message: string;
}

/** Engines that put weights on GPUs; the sim engine only pretends to. */
const GPU_ENGINES = new Set(["vllm", "sglang"]);

/**
 * The ports the engine itself will bind on this node: its HTTP port when the
 * rank serves HTTP, and on rank 0 the rendezvous port the other ranks dial.
 */
export function portsToBind(spec: StartShard, launch: Pick<EngineLaunch, "healthPath">): number[] {
  const ports: number[] = [];
  if (launch.healthPath !== null && spec.ports?.http) ports.push(spec.ports.http);
  if (spec.rank === 0) for (const p of spec.ports?.distInit ?? []) ports.push(p);
  return [...new Set(ports)];
}

export function validateLaunch(
  spec: StartShard,
  launch: Pick<EngineLaunch, "healthPath"> | undefined,
  facts: LaunchFacts,
  knownEngines: readonly string[],
): Problem[] {
  const problems: Problem[] = [];
  const add = (code: ProblemCode, message: string) => problems.push({ code, message });

  if (!spec.replicaId) add("bad_spec", "replica_id is empty");
  if (!spec.model) add("bad_spec", "model is empty");
  if (!knownEngines.includes(spec.engine)) {
    add("unknown_engine", `engine "${spec.engine}" is not one of ${knownEngines.join(", ")}`);
  }
  const world = spec.worldNodes || 1;
  if (spec.rank >= world) add("bad_spec", `rank ${spec.rank} is outside world_nodes ${world}`);
  const http = spec.ports?.http ?? 0;
  if (launch?.healthPath !== null && (http <= 0 || http > 65_535)) {
    add("bad_spec", `http port ${http} is not a usable port`);
  }
  if (world > 1) {
    if (spec.rank > 0) {
      const head = spec.peers.find((p) => p.rank === 0);
      if (!head?.address) add("bad_spec", "multi-node shard has no rank-0 peer address to rendezvous with");
      else if (!head.ports?.distInit.length && !spec.ports?.distInit.length) {
        add("bad_spec", "multi-node shard has no dist-init port for the rank-0 rendezvous");
      }
    } else if (!spec.ports?.distInit.length) {
      add("bad_spec", "multi-node rank 0 has no dist-init port to listen on for the other ranks");
    }
  }

  const tp = spec.tensorParallel || 1;
  const pp = spec.pipelineParallel || 1;
  const dp = spec.dataParallel || 1;
  const gpuEngine = GPU_ENGINES.has(spec.engine);
  const indices = spec.gpuIndices;
  if (new Set(indices).size !== indices.length) add("bad_spec", `gpu_indices repeat: ${indices.join(",")}`);
  if (gpuEngine) {
    if (indices.length === 0) add("parallel_mismatch", `${spec.engine} needs GPUs but the spec assigns none`);
    else if (tp * pp * dp !== indices.length * world) {
      add(
        "parallel_mismatch",
        `tensor ${tp} × pipeline ${pp} × data ${dp} = ${tp * pp * dp} GPUs, ` +
          `but the spec gives ${indices.length} GPU(s) × ${world} node(s) = ${indices.length * world}`,
      );
    }
    if (spec.engine === "vllm" && dp > 1 && world > 1 && dp % world !== 0) {
      add("bad_spec", `data parallel ${dp} does not split evenly over ${world} nodes`);
    }
  }

  const byIndex = new Map((facts.gpus ?? []).map((g) => [g.index, g]));
  for (const i of facts.gpus ? indices : []) {
    const gpu = byIndex.get(i);
    if (!gpu) {
      const have = (facts.gpus ?? []).map((g) => g.index).join(",") || "none";
      add("gpu_missing", `GPU ${i} does not exist on this node (GPUs: ${have})`);
      continue;
    }
    if (!gpuEngine) continue;
    const min = Number(spec.minGpuMemoryMib);
    if (min > 0 && gpu.memoryFreeMib < min) {
      add("gpu_memory", `GPU ${i}: ${gpu.memoryFreeMib} MiB free, the profile needs ${min} MiB`);
    }
    // vLLM (and SGLang's static fraction) reserves a share of *total* memory
    // and refuses to start when less than that is free; say so now.
    const util = spec.gpuMemoryUtilization;
    if (util > 0) {
      const want = Math.ceil(util * gpu.memoryTotalMib);
      if (gpu.memoryFreeMib < want) {
        add(
          "gpu_memory",
          `GPU ${i}: ${gpu.memoryFreeMib} MiB free, memory utilization ${util} of ` +
            `${gpu.memoryTotalMib} MiB needs ${want} MiB`,
        );
      }
    }
  }

  for (const p of facts.portsInUse) add("port_in_use", `port ${p} is already in use on this node`);
  if (!facts.binary.found) {
    add("binary_not_found", `engine binary "${facts.binary.name}" not found (on PATH or as a path)`);
  }
  return problems;
}

export function describeProblems(problems: readonly Problem[]): string {
  return `validation failed: ${problems.map((p) => p.message).join("; ")}`;
}

/** Problems waiting cannot clear: a spec that cannot fit this node will not fit it in 10 s either. */
const PERMANENT = new Set<ProblemCode>(["bad_spec", "unknown_engine", "parallel_mismatch", "gpu_missing"]);

/** Whether a launch refused for `problems` is worth retrying (busy ports, short memory or a missing binary may clear up). */
export function mayClearUp(problems: readonly Problem[]): boolean {
  return !problems.some((p) => PERMANENT.has(p.code));
}
