import type { EngineAdapter } from "./adapter.ts";
import { sglangAdapter } from "./sglang.ts";
import { simAdapter } from "./sim.ts";
import { vllmAdapter } from "./vllm.ts";

/** The engines a StartShard may name (`engine` field), kept in step with the config schema's engine kinds. */
const ADAPTERS: ReadonlyMap<string, EngineAdapter> = new Map(
  [vllmAdapter, sglangAdapter, simAdapter].map((a) => [a.engine, a]),
);

export function adapterFor(engine: string): EngineAdapter | undefined {
  return ADAPTERS.get(engine);
}

export function knownEngines(): string[] {
  return [...ADAPTERS.keys()];
}

/** Executable per engine, from agent flags such as `--vllm-bin`; unset engines use the adapter default. */
export type EngineBins = Partial<Record<string, string>>;
