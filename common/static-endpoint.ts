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

/** The longest engine key the edge takes: far beyond any real one, far below a header's limit. */
export const MAX_ENGINE_KEY = 1024;

/**
 * An engine's bearer key (vLLM's and SGLang's `--api-key`) as the edge
 * takes it and sends it, `Authorization: Bearer KEY`: printable ASCII
 * without spaces, since it goes into a header as it is. No message here
 * repeats the value.
 */
export const engineKeySchema = z
  .string()
  .min(1)
  .max(MAX_ENGINE_KEY)
  .regex(/^[\x21-\x7e]+$/, "must be printable ASCII without spaces (it is sent in a header)");

/** A variable's name as a shell sets it. */
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

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
  // The name of a variable, never the key: files are committed and shared,
  // the key stays in the environment of whichever process pushes the set.
  api_key_env: z
    .string()
    .regex(ENV_NAME, "must be an environment variable's name (letters, digits, _), not the key itself")
    .optional()
    .describe(
      "The environment variable holding the key the engine requires (its --api-key), read by the process that pushes the endpoint set; the edge sends it as Authorization: Bearer",
    ),
});

export type StaticEndpointConfig = z.output<typeof staticEndpointSchema>;

/** An issue of a list of static endpoints at its path, as every door reports one: `endpoints[2].api_key_env: …`. */
export function endpointIssueText(i: { index: number; field: string; message: string }): string {
  return `endpoints[${i.index}].${i.field}: ${i.message}`;
}

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

/** Where `api_key_env` is read: process.env at the callers, something else in a test. */
export type EnvLookup = Readonly<Record<string, string | undefined>>;

/**
 * The key an endpoint's `api_key_env` holds in `env`, "" for none: only
 * the variable itself, never something `env` inherits (`toString`).
 */
export function staticEndpointKey(e: StaticEndpointConfig, env: EnvLookup): string {
  const name = e.api_key_env;
  return (name !== undefined && Object.hasOwn(env, name) && env[name]) || "";
}

/** What is wrong with an endpoint's `api_key_env` in `env`, or undefined: the variable unset, empty, or no key. */
function keyEnvIssue(e: StaticEndpointConfig, env: EnvLookup): string | undefined {
  const name = e.api_key_env;
  if (name === undefined) return undefined;
  const value = staticEndpointKey(e, env);
  if (value === "") return `${name} is not set`;
  const r = engineKeySchema.safeParse(value);
  return r.success ? undefined : `${name}: ${r.error.issues[0]!.message}`;
}

/**
 * The list's `api_key_env` variables that `env` does not hold as a key,
 * each at its index: what the process that pushes the set reports by path
 * (`endpoints[2].api_key_env: LLMGW_KEY_A is not set`) before pushing.
 */
export function staticEndpointKeyIssues(
  list: readonly StaticEndpointConfig[],
  env: EnvLookup,
): { index: number; field: "api_key_env"; message: string }[] {
  return list.flatMap((e, index) => {
    const message = keyEnvIssue(e, env);
    return message === undefined ? [] : [{ index, field: "api_key_env" as const, message }];
  });
}

/** A static endpoint whose key cannot be read: staticEndpointKeyIssues says which, by path, beforehand. */
export class StaticEndpointKeyError extends Error {}

/**
 * Static endpoints as EdgeSync carries them, each key read from `env`
 * (`api_key_env`; process.env at the callers): `list.map(staticEndpointIn(env))`.
 * Throws StaticEndpointKeyError naming the endpoint and the variable, never
 * a value, when that variable holds no key.
 */
export function staticEndpointIn(env: EnvLookup): (e: StaticEndpointConfig) => Endpoint {
  return (e) => {
    const issue = keyEnvIssue(e, env);
    if (issue !== undefined) throw new StaticEndpointKeyError(`endpoint "${e.id}": api_key_env: ${issue}`);
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
      apiKey: staticEndpointKey(e, env),
    });
  };
}
