/**
 * What a replica was launched with, in the terms of its profile: the parts
 * of a StartShard that a change of the profile changes, and nothing that
 * placement decides (GPUs, ports, peers) or that only steers the lifecycle
 * (deadlines, graces), so an edit of `stop_grace` replaces no engine.
 * Adoption, reinstatement and the rollout all ask the same question of it:
 * does this replica run what the profile asks for now?
 */
import type { CatalogProfile } from "../catalog.ts";
import type { ShardSpecSummary } from "./types.ts";

/** The spec a replica placed now for `p` runs. */
export function specOf(p: CatalogProfile): ShardSpecSummary {
  return {
    engine: p.engine,
    source: p.source,
    tensorParallel: p.tensorParallel,
    pipelineParallel: p.pipelineParallel,
    dataParallel: p.dataParallel,
    nodes: p.nodes,
    gpusPerNode: p.gpusPerNode,
    args: [...p.config.engine_args],
    env: { ...p.config.env },
    memoryFraction: p.memoryFraction,
  };
}

/**
 * Why a replica's spec is not what the profile launches now, or undefined
 * when it is (or when its spec is not known yet: a replica kept across a
 * restart and not yet reported is taken as current, never replaced on a guess).
 * Environment values are never named: they may hold tokens.
 */
export function specMismatch(spec: ShardSpecSummary | undefined, p: CatalogProfile): string | undefined {
  if (!spec) return undefined;
  const want = specOf(p);
  const pairs: [string, unknown, unknown][] = [
    ["engine", spec.engine, want.engine],
    ["source", spec.source, want.source],
    ["tensor_parallel", spec.tensorParallel, want.tensorParallel],
    ["pipeline_parallel", spec.pipelineParallel, want.pipelineParallel],
    ["data_parallel", spec.dataParallel, want.dataParallel],
    ["nodes", spec.nodes, want.nodes],
    ["gpus_per_node", spec.gpusPerNode, want.gpusPerNode],
    ["gpu_memory_utilization", spec.memoryFraction, want.memoryFraction],
  ];
  for (const [name, have, wanted] of pairs)
    if (have !== wanted) return `${name} is ${have}, profile wants ${wanted}`;
  if (spec.args.join("\u0000") !== want.args.join("\u0000"))
    return `engine_args are ${JSON.stringify(spec.args)}, profile wants ${JSON.stringify(want.args)}`;
  const names = new Set([...Object.keys(spec.env), ...Object.keys(want.env)]);
  const changed = [...names].filter((n) => spec.env[n] !== want.env[n]).sort();
  if (changed.length > 0) return `env differs in ${changed.join(", ")}`;
  return undefined;
}

/**
 * Whether a replica running `spec` is a gang of the profile's size. One of
 * another world size cannot have its ranks counted against this profile's,
 * so it is neither adopted nor reinstated; anything else that differs still
 * serves the model, and the rollout replaces it make before break.
 */
export function sameWorld(spec: ShardSpecSummary | undefined, p: CatalogProfile): boolean {
  return spec === undefined || spec.nodes === p.nodes;
}
