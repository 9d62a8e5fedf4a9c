/**
 * The model catalog: the one place the model rules live. Built from an
 * already schema-validated configuration; everything the schema cannot say
 * about one field in isolation (uniqueness across models, fallback graphs,
 * parallelism arithmetic) is checked here, and every problem is reported at
 * once with the path of the key to fix — an operator editing a fleet config
 * should not have to run `config check` once per mistake.
 *
 * Pure: no Node or Workers APIs, so the control plane, a Durable Object, the
 * CLI, tests and benchmarks all build the same catalog from the same config.
 */

import { checkCatalogNames } from "../common/catalog-names.ts";
import { ownedArgs, ownedEnv } from "../common/engine-args.ts";
import { endpointIssueText, staticEndpointListIssues } from "../common/static-endpoint.ts";
import type {
  Config,
  EndpointConfig,
  EngineKind,
  ModelConfig,
  ProfileConfig,
  ScalingConfig,
} from "./config/schema.ts";

export type PlacementStrategy = "binpack" | "spread";

/** A deployment profile with its derived numbers filled in. */
export interface CatalogProfile {
  readonly model: string;
  readonly name: string;
  /** `<model>/<profile>`: the prefix of every replica id of this profile. */
  readonly key: string;
  readonly engine: EngineKind;
  readonly source: string;
  readonly tensorParallel: number;
  readonly pipelineParallel: number;
  readonly dataParallel: number;
  /** tp × pp × dp: GPUs one replica occupies in total. */
  readonly gpusPerReplica: number;
  readonly gpusPerNode: number;
  /** Nodes per replica: one shard (rank) per node. */
  readonly nodes: number;
  /** Case-insensitive substring of the GPU name, e.g. "H100". */
  readonly gpuModel: string | undefined;
  /** Minimum total VRAM per GPU, MiB (0 = any). */
  readonly minMemoryMiB: number;
  /** Fraction of each GPU's total VRAM the engine claims at start. */
  readonly memoryFraction: number;
  /** Fabric label key every node of a multi-node replica must share a value of. */
  readonly fabric: string | undefined;
  readonly replicas: { readonly min: number; readonly max: number };
  readonly strategy: PlacementStrategy;
  readonly startupDeadlineMs: number;
  readonly stopGraceMs: number;
  /** How a change of this profile replaces its running replicas (reconcile/rollout.ts). */
  readonly rollout: { readonly maxSurge: number; readonly maxUnavailable: number; readonly paused: boolean };
  /** The profile as configured, for the engine adapters. */
  readonly config: ProfileConfig;
}

/** A model's scaling settings, its overrides laid over the top-level section. */
export interface ScalingSettings {
  readonly enabled: boolean;
  readonly targetSaturation: number;
  readonly tolerance: number;
  readonly windowMs: number;
  readonly scaleUpCooldownMs: number;
  readonly scaleDownCooldownMs: number;
}

export interface CatalogModel {
  readonly name: string;
  /** Higher takes replicas above `min` from lower when GPUs are short. */
  readonly priority: number;
  readonly scaling: ScalingSettings;
  readonly aliases: readonly string[];
  /** Canonical model names, in the order they are tried. */
  readonly fallbacks: readonly string[];
  readonly routing: string;
  readonly profiles: readonly CatalogProfile[];
  /** No profiles: the control plane places nothing, static endpoints serve it. */
  readonly routerOnly: boolean;
  /** Static endpoints that list this model (by name or alias). */
  readonly endpoints: readonly EndpointConfig[];
}

export class CatalogError extends Error {
  constructor(readonly issues: string[]) {
    super(`invalid model catalog:\n${issues.map((i) => `  - ${i}`).join("\n")}`);
  }
}

export class Catalog {
  private readonly byName = new Map<string, CatalogModel>();
  private readonly profileByKey = new Map<string, CatalogProfile>();

  constructor(
    readonly models: readonly CatalogModel[],
    /** Problems that do not stop the catalog from working, e.g. a router-only model nothing serves. */
    readonly warnings: readonly string[] = [],
  ) {
    for (const m of models) {
      this.byName.set(m.name, m);
      for (const a of m.aliases) this.byName.set(a, m);
      for (const p of m.profiles) this.profileByKey.set(p.key, p);
    }
  }

  /** Looks a model up by its name or any alias. */
  get(nameOrAlias: string): CatalogModel | undefined {
    return this.byName.get(nameOrAlias);
  }

  /** A profile by `<model>/<profile>` key or by model name/alias and profile name. */
  profile(modelOrKey: string, profileName?: string): CatalogProfile | undefined {
    if (profileName === undefined) return this.profileByKey.get(modelOrKey);
    return this.get(modelOrKey)?.profiles.find((p) => p.name === profileName);
  }

  /** Every placeable profile, in config order. */
  profiles(): CatalogProfile[] {
    return this.models.flatMap((m) => m.profiles);
  }

  /** True when at least one model needs the control plane to place replicas. */
  get controlPlaneMode(): boolean {
    return this.models.some((m) => !m.routerOnly);
  }
}

// ---------------------------------------------------------------------------

const routingName = /^[a-z][a-z0-9_-]*$/;

/**
 * Parallelism arithmetic, following what vLLM and SGLang actually accept:
 *
 * - a replica uses tp × pp × dp GPUs, split evenly across `nodes` (one
 *   shard per node), so gpus_per_node × nodes must equal tp × pp × dp;
 * - vLLM (and the sim engine, its stand-in) keeps each tensor-parallel group
 *   inside one node — all-reduce over the network is what pipeline
 *   parallelism exists to avoid — so tensor_parallel must divide the GPUs per
 *   node. Pipeline stages then span nodes (tp8 pp2 over two 8-GPU nodes);
 * - SGLang's `--tp` is the total across nodes (`--tp 16 --nnodes 2`), so for
 *   it a tensor-parallel group may instead cover whole nodes: gpus_per_node
 *   dividing tensor_parallel is also accepted;
 * - with several nodes and data_parallel > 1, vLLM's multiprocessing backend
 *   needs every data-parallel rank (tp × pp GPUs) to fit on one node;
 * - `engine_args` and `env` must not repeat what llmgw sets itself
 *   (common/engine-args.ts): the engines take the last occurrence, and a
 *   profile's env is applied last, so either would undo placement;
 * - a multi-node replica must name a fabric label key: ranks on nodes that do
 *   not share one NCCL fabric run at TCP speed, if at all.
 */
function checkProfile(p: ProfileConfig, path: string, issues: string[]): CatalogProfile | undefined {
  const before = issues.length;
  const tp = p.tensor_parallel;
  const pp = p.pipeline_parallel;
  const dp = p.data_parallel;
  const world = tp * pp * dp;
  const nodes = p.nodes;
  let gpn = p.gpus_per_node;
  if (gpn === undefined) {
    if (world % nodes !== 0) {
      issues.push(
        `${path}.nodes: must divide tensor_parallel × pipeline_parallel × data_parallel (${tp} × ${pp} × ${dp} = ${world})`,
      );
    } else gpn = world / nodes;
  } else if (gpn * nodes !== world) {
    issues.push(
      `${path}.gpus_per_node: gpus_per_node × nodes (${gpn} × ${nodes} = ${gpn * nodes}) must equal tensor_parallel × pipeline_parallel × data_parallel (${tp} × ${pp} × ${dp} = ${world})`,
    );
  }
  if (gpn !== undefined && gpn * nodes === world) {
    const tpSpansNodes = p.engine === "sglang" && tp % gpn === 0;
    if (gpn % tp !== 0 && !tpSpansNodes) {
      issues.push(
        p.engine === "sglang"
          ? `${path}.tensor_parallel: must divide the GPUs per node (${gpn}) or be a multiple of it`
          : `${path}.tensor_parallel: must divide the GPUs per node (${gpn})`,
      );
    } else if (nodes > 1 && dp > 1 && p.engine !== "sglang" && gpn % (tp * pp) !== 0) {
      issues.push(
        `${path}.data_parallel: with several nodes each data-parallel rank must fit on one node (tensor_parallel × pipeline_parallel = ${tp * pp}, GPUs per node ${gpn})`,
      );
    }
  }
  if (nodes > 1 && !p.fabric) {
    issues.push(
      `${path}.fabric: a profile spanning ${nodes} nodes must name a fabric label key (e.g. "ib") its nodes share`,
    );
  }
  const max = p.replicas.max ?? p.replicas.min;
  if (max < p.replicas.min) {
    issues.push(`${path}.replicas.max: must be at least replicas.min (${p.replicas.min})`);
  }
  if (p.startup_deadline <= 0) issues.push(`${path}.startup_deadline: must be positive`);
  if (p.rollout.max_surge === 0 && p.rollout.max_unavailable === 0) {
    issues.push(
      `${path}.rollout: max_surge and max_unavailable cannot both be 0: a changed profile could never replace a replica`,
    );
  }
  for (const o of ownedArgs(p.engine, p.engine_args))
    issues.push(`${path}.engine_args[${o.index}]: ${o.message}`);
  for (const o of ownedEnv(p.env)) issues.push(`${path}.env.${o.name}: ${o.message}`);
  if (issues.length > before || gpn === undefined) return undefined;
  return {
    model: "",
    name: p.name,
    key: "",
    engine: p.engine,
    source: p.source,
    tensorParallel: tp,
    pipelineParallel: pp,
    dataParallel: dp,
    gpusPerReplica: world,
    gpusPerNode: gpn,
    nodes,
    gpuModel: p.gpu.model,
    minMemoryMiB: Math.round((p.gpu.min_memory_gib ?? 0) * 1024),
    memoryFraction: p.gpu_memory_utilization,
    fabric: nodes > 1 ? p.fabric : undefined,
    replicas: { min: p.replicas.min, max },
    strategy: p.spread ? "spread" : "binpack",
    startupDeadlineMs: p.startup_deadline,
    stopGraceMs: p.stop_grace,
    rollout: {
      maxSurge: p.rollout.max_surge,
      maxUnavailable: p.rollout.max_unavailable,
      paused: p.rollout.paused,
    },
    config: p,
  };
}

/** All catalog problems of a validated config, path-named; empty when fine. */
export function validateConfig(config: Config): string[] {
  return analyse(config).issues;
}

/** Builds the catalog, or throws a CatalogError carrying every problem at once. */
/** The catalog rules' verdict on a config, without building anything. */
export function catalogIssues(config: Config): string[] {
  return analyse(config).issues;
}

export function buildCatalog(config: Config): Catalog {
  const { issues, catalog } = analyse(config);
  if (issues.length > 0 || !catalog) throw new CatalogError(issues);
  return catalog;
}

function analyse(config: Config): { issues: string[]; catalog?: Catalog } {
  const issues: string[] = [];
  const warnings: string[] = [];
  const models = config.models;
  const defaultRouting = config.router.default_routing;

  const names = checkCatalogNames(models);
  issues.push(...names.issues);
  const { canonical } = names;

  const catalogModels: CatalogModel[] = [];
  checkScaling(config.scaling, "scaling", issues);
  models.forEach((m: ModelConfig, i) => {
    const own = Object.entries(m.scaling ?? {}).filter(([, v]) => v !== undefined);
    const scaling: ScalingConfig = { ...config.scaling, ...Object.fromEntries(own) };
    if (m.scaling) checkScaling(scaling, `models[${i}].scaling`, issues);
    const routing = m.routing ?? defaultRouting;
    if (!routingName.test(routing)) {
      issues.push(`models[${i}].routing: "${routing}" must be lower-case letters, digits, - or _`);
    }
    const seenProfiles = new Map<string, number>();
    const profiles: CatalogProfile[] = [];
    m.profiles.forEach((p, j) => {
      const path = `models[${i}].profiles[${j}]`;
      const dup = seenProfiles.get(p.name);
      if (dup !== undefined) issues.push(`${path}.name: "${p.name}" is already used by profiles[${dup}]`);
      else seenProfiles.set(p.name, j);
      if (p.name.includes("/")) issues.push(`${path}.name: must not contain "/" (it is part of replica ids)`);
      const cp = checkProfile(p, path, issues);
      if (cp) profiles.push({ ...cp, model: m.name, key: `${m.name}/${p.name}` });
    });
    const names = new Set([m.name, ...m.aliases]);
    const endpoints = config.endpoints.filter((e) => e.models.some((n) => names.has(n)));
    if (m.profiles.length === 0 && endpoints.length === 0) {
      warnings.push(
        `models[${i}] (${m.name}): router-only (no profiles) and no static endpoint serves it yet; set one with \`llmgw ctl endpoints set\``,
      );
    }
    catalogModels.push({
      name: m.name,
      priority: m.priority,
      scaling: {
        enabled: scaling.enabled,
        targetSaturation: scaling.target_saturation,
        tolerance: scaling.tolerance,
        windowMs: scaling.window,
        scaleUpCooldownMs: scaling.scale_up_cooldown,
        scaleDownCooldownMs: scaling.scale_down_cooldown,
      },
      aliases: m.aliases,
      fallbacks: m.fallbacks.flatMap((f) => {
        const k = canonical(f);
        return k === undefined ? [] : [models[k]!.name];
      }),
      routing,
      profiles,
      routerOnly: m.profiles.length === 0,
      endpoints,
    });
  });

  for (const c of staticEndpointListIssues(config.endpoints)) {
    issues.push(endpointIssueText(c));
  }
  config.endpoints.forEach((e, i) => {
    e.models.forEach((n, j) => {
      if (canonical(n) === undefined) issues.push(`endpoints[${i}].models[${j}]: unknown model "${n}"`);
    });
  });

  if (issues.length > 0) return { issues };
  return { issues, catalog: new Catalog(catalogModels, warnings) };
}

/** The one rule spanning two scaling keys: a dead band reaching 0 would never scale down. */
function checkScaling(s: ScalingConfig, path: string, issues: string[]): void {
  if (s.tolerance >= s.target_saturation) {
    issues.push(
      `${path}.tolerance: must be below target_saturation (${s.target_saturation}), or the model never scales down`,
    );
  }
}
