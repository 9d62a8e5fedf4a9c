/**
 * A static endpoint: an engine the operator runs and names by URL, rather
 * than one the control plane placed. Two doors take the same list — the
 * config file's `endpoints:` and `llmgw ctl endpoints set`'s file — so its
 * shape, the rules across the list and its EdgeSync form live here, once,
 * for the control plane and the cli alike (docs/edge.md, router-only mode).
 */
import { create } from "@bufbuild/protobuf";
import { z } from "zod";
import { type Endpoint, EndpointSchema } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { DEFAULT_SPILL_GROUP, spillGroupPriorityConflicts, viaSchema } from "./endpoint-fields.ts";

export const staticEndpointSchema = z.strictObject({
  id: z.string().min(1).describe("Unique endpoint id"),
  url: z.url({ protocol: /^https?$/ }).describe("Base URL of an OpenAI-compatible engine"),
  models: z.array(z.string().min(1)).min(1).describe("Models (names or aliases) this endpoint serves"),
  pool: z
    .string()
    .default(DEFAULT_SPILL_GROUP)
    .describe("Spill group: a lower-priority group takes requests only when higher ones cannot"),
  weight: z.number().positive().default(1).describe("Relative share of traffic (heterogeneous GPUs)"),
  priority: z
    .number()
    .int()
    .default(0)
    .describe("Priority of the endpoint's spill group; a group's endpoints share one (docs/routing.md)"),
  via: viaSchema
    .default("direct")
    .describe("How the edge reaches it: direct (its URL), vpc (Workers VPC binding) or tunnel (Access)"),
  // A static endpoint's load is scraped by nobody, so its batch is the
  // operator's to say (without it the pool assumes vLLM's default); its KV
  // tokens, unstated, the control plane reads once off its /metrics
  // (controlplane/static-capacity.ts).
  capacity: z
    .strictObject({
      max_num_seqs: z
        .number()
        .int()
        .positive()
        .optional()
        .describe("Requests the engine runs at once (vLLM --max-num-seqs, SGLang --max-running-requests)"),
      kv_tokens: z
        .number()
        .int()
        .positive()
        .optional()
        .describe(
          "Tokens the engine's KV cache holds (vLLM: num_gpu_blocks × block_size); unset: the control plane reads it off /metrics",
        ),
    })
    .optional()
    .describe(
      "What the engine can hold; the edge's pool counts each request's demand against it (docs/routing.md)",
    ),
  served_model_name: z
    .string()
    .min(1)
    .max(256)
    .optional()
    .describe("The model name sent to this engine (its --served-model-name); default: the catalog's name"),
});

export type StaticEndpointConfig = z.output<typeof staticEndpointSchema>;

/**
 * What is wrong across a list of static endpoints, each issue at its index
 * and field: an id used twice, a spill group given two priorities.
 */
export function staticEndpointListIssues(
  list: readonly StaticEndpointConfig[],
): { index: number; field: "id" | "priority"; message: string }[] {
  const out: { index: number; field: "id" | "priority"; message: string }[] = [];
  const seen = new Map<string, number>();
  list.forEach((e, index) => {
    const first = seen.get(e.id);
    if (first !== undefined)
      out.push({ index, field: "id", message: `duplicate id "${e.id}" (also endpoints[${first}])` });
    else seen.set(e.id, index);
  });
  for (const c of spillGroupPriorityConflicts(list))
    out.push({ index: c.index, field: "priority", message: c.message });
  return out.sort((a, b) => a.index - b.index);
}

/** A static endpoint as EdgeSync carries it. */
export function staticEndpoint(e: StaticEndpointConfig): Endpoint {
  return create(EndpointSchema, {
    id: e.id,
    url: e.url,
    models: [...e.models],
    pool: e.pool,
    weight: e.weight,
    priority: e.priority,
    via: e.via,
    maxNumSeqs: e.capacity?.max_num_seqs ?? 0,
    kvTokens: BigInt(e.capacity?.kv_tokens ?? 0),
    servedModelName: e.served_model_name ?? "",
  });
}
