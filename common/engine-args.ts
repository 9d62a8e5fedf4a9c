/**
 * Engine arguments (and the few environment variables) llmgw sets itself,
 * which a profile's `engine_args` (and `env`) must not set again. The engines' parsers let the last occurrence win, and
 * `engine_args` come last, so a repeated one would quietly undo what
 * placement decided: a `--port` the agent does not probe (the shard never
 * turns ready), a tensor-parallel size unlike the GPUs it was given, a
 * memory share placement did not count. Each says where its value comes
 * from instead. Pure; the adapters (agent/engines) are pinned to this list
 * by their tests, the catalog (controlplane/catalog.ts) refuses with it.
 */

/** Why a flag is not the profile's to give, and what to set instead. */
type Owner = string;

const PLACEMENT = "placement assigns each replica its address and ports";
const NAME = "the model's name is what the edge routes on";
const WORLD = "llmgw builds the multi-node layout from nodes and the parallel sizes";
const KEY =
  "the control plane gives each replica's engine a key of its own and the edge sends it (docs/security.md, engine keys); another would refuse the edge";

const VLLM: Record<string, Owner> = {
  "--host": PLACEMENT,
  "--port": PLACEMENT,
  "--model": "set the profile's source",
  "--served-model-name": NAME,
  "--tensor-parallel-size": "set the profile's tensor_parallel",
  "-tp": "set the profile's tensor_parallel",
  "--pipeline-parallel-size": "set the profile's pipeline_parallel",
  "-pp": "set the profile's pipeline_parallel",
  "--data-parallel-size": "set the profile's data_parallel",
  "-dp": "set the profile's data_parallel",
  "--data-parallel-size-local": WORLD,
  "--data-parallel-start-rank": WORLD,
  "--data-parallel-address": PLACEMENT,
  "--data-parallel-rpc-port": PLACEMENT,
  "--nnodes": WORLD,
  "--node-rank": WORLD,
  "--master-addr": PLACEMENT,
  "--master-port": PLACEMENT,
  "--headless": WORLD,
  "--gpu-memory-utilization": "set the profile's gpu_memory_utilization, which placement counts",
  "--api-key": KEY,
};

const SGLANG: Record<string, Owner> = {
  "--model-path": "set the profile's source",
  "--host": PLACEMENT,
  "--port": PLACEMENT,
  "--served-model-name": NAME,
  "--tp": "set the profile's tensor_parallel",
  "--tp-size": "set the profile's tensor_parallel",
  "--tensor-parallel-size": "set the profile's tensor_parallel",
  "--pp-size": "set the profile's pipeline_parallel",
  "--pipeline-parallel-size": "set the profile's pipeline_parallel",
  "--dp": "set the profile's data_parallel",
  "--dp-size": "set the profile's data_parallel",
  "--data-parallel-size": "set the profile's data_parallel",
  "--nnodes": WORLD,
  "--node-rank": WORLD,
  "--dist-init-addr": PLACEMENT,
  "--mem-fraction-static": "set the profile's gpu_memory_utilization, which placement counts",
  "--api-key": KEY,
};

const OWNED: Record<string, Record<string, Owner>> = { vllm: VLLM, sim: VLLM, sglang: SGLANG };

/** `--flag`, `--flag=value` and underscores (`--max_num_seqs`) name the same flag, as the engines' parsers take them. */
export function flagName(arg: string): string | undefined {
  if (!arg.startsWith("-")) return undefined;
  const name = arg.split("=")[0] ?? arg;
  return name.startsWith("--") ? `--${name.slice(2).replaceAll("_", "-")}` : name;
}

/** Why `arg` is not the profile's to give to `engine`, or undefined when it may. */
export function ownedArg(engine: string, arg: string): string | undefined {
  const name = flagName(arg);
  return name === undefined ? undefined : OWNED[engine]?.[name];
}

/** Each argument of `args` llmgw sets itself for `engine`, with its index and a message naming where its value comes from. */
export function ownedArgs(engine: string, args: readonly string[]): { index: number; message: string }[] {
  const found: { index: number; message: string }[] = [];
  args.forEach((arg, index) => {
    const why = ownedArg(engine, arg);
    if (why) found.push({ index, message: `${flagName(arg)} is set by llmgw: ${why}; remove it` });
  });
  return found;
}

/**
 * Environment the adapters set that a profile's `env` (applied last, and
 * otherwise winning: an operator may retune NCCL's interface or vLLM's host
 * address) must not undo, because placement counted on it.
 */
const OWNED_ENV: Record<string, Owner> = {
  CUDA_VISIBLE_DEVICES: "placement assigns each shard its GPUs",
  CUDA_DEVICE_ORDER: "llmgw sets PCI_BUS_ID so that the GPU indices placement assigns are nvidia-smi's",
  VLLM_DP_MASTER_PORT: PLACEMENT,
  VLLM_API_KEY: KEY,
};

/**
 * Environment the adapters set that a profile's `env` may retune: which
 * interface NCCL and Gloo bootstrap over, and the address vLLM's ranks meet
 * on, are the operator's to know better on an odd network.
 */
export const RETUNABLE_ENV: readonly string[] = ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "VLLM_HOST_IP"];

/** Each variable of `env` llmgw sets itself, with a message naming where its value comes from. */
export function ownedEnv(env: Readonly<Record<string, string>>): { name: string; message: string }[] {
  return Object.keys(env)
    .filter((name) => OWNED_ENV[name] !== undefined)
    .map((name) => ({ name, message: `${name} is set by llmgw: ${OWNED_ENV[name]}; remove it` }));
}
