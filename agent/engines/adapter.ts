/**
 * An engine adapter turns a shard spec into the exact process to run. It is a
 * pure function of the spec and the node it runs on, so the command line an
 * operator will see in `ps` is pinned by unit tests, and the same
 * construction runs in tests against the sim engine standing in for the real
 * binary.
 */
import { flagName } from "../../common/engine-args.ts";
import { type KvCapacitySource, SGLANG_KV_CAPACITY, VLLM_KV_CAPACITY } from "../../common/engine-capacity.ts";
import type { EngineCapacity } from "../../common/sglang-server-info.ts";
import type { StartShard } from "../../proto/gen/agent/v1/agent_pb.ts";

/** What the agent knows about the node that the spec does not say. */
export interface NodeContext {
  /** The address other nodes and the edge reach this node on. */
  advertiseAddress: string;
  /** Interface NCCL/Gloo bootstrap over when the spec names none (`control.mgmt_interface`). */
  mgmtInterface?: string;
  /** The engine executable (`--vllm-bin`, `--sglang-bin`); each adapter has its own default. */
  bin?: string;
  /**
   * Address the engine's HTTP server binds. Defaults to the advertise
   * address, so the engine is reachable exactly where the edge was told to
   * look and nowhere else.
   */
  listenHost?: string;
}

/** Where the scraper finds load in this engine's Prometheus output. */
export interface MetricNames {
  waiting: string;
  running: string;
  /** A 0..1 gauge of KV-cache use. */
  kvUsage: string;
  /**
   * vLLM exports prefix-cache counters (the hit rate is a ratio of deltas
   * between scrapes); SGLang exports the rate itself as a gauge.
   */
  prefixHitRate: { kind: "counters"; queries: string; hits: string } | { kind: "gauge"; name: string };
  /** The lifetime counter of generated tokens; optional to the engine (absent counts as 0, not missing). */
  generationTokens: string;
  /** Where its KV cache's tokens are; optional (an engine that states none is charged no token term). */
  kvCapacity?: KvCapacitySource;
}

/**
 * Where an engine states its capacity beyond its metrics, and how that is
 * read: SGLang's server info, the one place it says the batch it sized from
 * memory. Asked once the engine serves, until it answers.
 */
export interface CapacityProbe {
  /** Asked in order, a 404 moving on to the next. */
  paths: readonly string[];
  read(body: unknown): EngineCapacity;
}

export interface EngineLaunch {
  /** argv[0] is the executable (looked up on PATH when it has no slash). */
  argv: string[];
  /** Added to (and overriding) the agent's own environment. */
  env: Record<string, string>;
  /** Host to probe health and metrics on (a wildcard listen address becomes loopback). */
  probeHost: string;
  port: number;
  /**
   * Null for ranks that serve no HTTP (vLLM `--headless`, SGLang non-zero
   * ranks): such a rank is ready once it runs, and the replica's readiness is
   * its rank 0's.
   */
  healthPath: string | null;
  /**
   * How long one health GET may take; unset, the agent's own bound (1 s).
   * An engine whose health check does work (SGLang generates a token and
   * looks for it a second later) needs longer, or a busy engine would
   * read as dead.
   */
  healthTimeoutMs?: number;
  metricsPath: string | null;
  metricNames: MetricNames;
  /**
   * Requests the engine runs at once, from its arguments or the engine's
   * known default; undefined when neither says (the edge then assumes, or
   * the capacity probe learns it).
   */
  maxNumSeqs: number | undefined;
  /** Null for an engine whose metrics and arguments say all there is, or a rank that serves no HTTP. */
  capacityProbe: CapacityProbe | null;
  /**
   * The key the engine requires on its API ("" for none): what the agent
   * sends with a probe that needs it, and what it blanks out of anything it
   * shows or reports (the command line, the output's tail).
   */
  apiKey: string;
}

export interface EngineAdapter {
  readonly engine: string;
  readonly defaultBin: string;
  build(spec: StartShard, node: NodeContext): EngineLaunch;
}

export const VLLM_METRICS: MetricNames = {
  waiting: "vllm:num_requests_waiting",
  running: "vllm:num_requests_running",
  kvUsage: "vllm:kv_cache_usage_perc",
  prefixHitRate: { kind: "counters", queries: "vllm:prefix_cache_queries", hits: "vllm:prefix_cache_hits" },
  generationTokens: "vllm:generation_tokens",
  kvCapacity: VLLM_KV_CAPACITY,
};

export const SGLANG_METRICS: MetricNames = {
  waiting: "sglang:num_queue_reqs",
  running: "sglang:num_running_reqs",
  kvUsage: "sglang:token_usage",
  prefixHitRate: { kind: "gauge", name: "sglang:cache_hit_rate" },
  generationTokens: "sglang:generation_tokens",
  kvCapacity: SGLANG_KV_CAPACITY,
};

/**
 * A rank > 0 of a multi-node replica: it runs workers only (vLLM's
 * `--headless`, SGLang's schedulers), and rank 0 serves the replica's API.
 */
export function servesNoHttp(spec: StartShard): boolean {
  return spec.worldNodes > 1 && spec.rank > 0;
}

/** The rank-0 peer's address and first dist-init port: the rendezvous every rank dials. */
export function rendezvous(spec: StartShard, node: NodeContext): { host: string; port: number | undefined } {
  if (spec.rank === 0) return { host: node.advertiseAddress, port: spec.ports?.distInit[0] };
  const head = spec.peers.find((p) => p.rank === 0);
  return {
    host: head?.address ?? node.advertiseAddress,
    port: head?.ports?.distInit[0] ?? spec.ports?.distInit[0],
  };
}

export function listenHost(node: NodeContext): string {
  return node.listenHost ?? node.advertiseAddress;
}

export function probeHostFor(host: string): string {
  if (host === "0.0.0.0" || host === "") return "127.0.0.1";
  if (host === "::") return "::1";
  return host;
}

/**
 * Environment shared by every GPU engine. The interface variables are only
 * set for multi-node shards: NCCL refuses to bootstrap at all when the named
 * interface does not exist, and a single-node shard needs no network between
 * ranks, so a wrong `mgmt_interface` must not break every single-node
 * replica on a host whose NIC is called ens5.
 */
export function gpuEnv(spec: StartShard, node: NodeContext): Record<string, string> {
  const env: Record<string, string> = {
    // Index order must match nvidia-smi's, which is PCI bus order; CUDA's
    // default "fastest first" order would make our indices point at other GPUs.
    CUDA_DEVICE_ORDER: "PCI_BUS_ID",
    CUDA_VISIBLE_DEVICES: spec.gpuIndices.join(","),
  };
  const ifname = spec.mgmtInterface || node.mgmtInterface || "";
  if (spec.worldNodes > 1 && ifname) {
    // "=" makes NCCL match the name exactly instead of as a prefix (eth0
    // would otherwise also match eth01); Gloo takes a plain name only.
    env.NCCL_SOCKET_IFNAME = `=${ifname}`;
    env.GLOO_SOCKET_IFNAME = ifname;
  }
  return env;
}

/** Every occurrence of `secret` in `text` blanked out: for a launch's key in what the agent logs or reports. */
export function redacted(text: string, secret: string): string {
  return secret ? text.replaceAll(secret, "[engine key]") : text;
}

/**
 * vLLM's key in its environment (VLLM_API_KEY), where `ps` does not show
 * it; vLLM then requires it on every /v1 route. After the operator's env:
 * the catalog refuses that variable in a profile, and this keeps it so.
 */
export function withApiKeyEnv(env: Record<string, string>, spec: StartShard): Record<string, string> {
  return spec.engineApiKey ? { ...env, VLLM_API_KEY: spec.engineApiKey } : env;
}

/** Operator-given env wins over everything the adapter chose. */
export function withSpecEnv(env: Record<string, string>, spec: StartShard): Record<string, string> {
  return { ...env, ...spec.env };
}

export function fraction(n: number): string {
  // Proto doubles arrive as 0.9000000000000001 often enough to be ugly in `ps`.
  return String(Math.round(n * 10_000) / 10_000);
}

/** Whether a switch is among an engine's extra arguments, spelt as its parser takes it (common/engine-args.ts flagName). */
export function hasFlag(args: readonly string[], flag: string): boolean {
  return args.some((a) => flagName(a) === flag);
}

/**
 * An integer flag's value in an engine's extra arguments (`--flag N` or
 * `--flag=N`, dashes or underscores, as vLLM and SGLang both accept); the
 * last one wins, as it does for their parsers.
 */
export function intFlag(args: readonly string[], flag: string): number | undefined {
  let found: number | undefined;
  args.forEach((a, i) => {
    if (flagName(a) !== flag) return;
    const eq = a.indexOf("=");
    const v = Number(eq > 0 ? a.slice(eq + 1) : args[i + 1]);
    if (Number.isInteger(v) && v > 0) found = v;
  });
  return found;
}
