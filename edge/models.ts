import type { Context } from "hono";
import { caller } from "./caller.ts";
import type { RoutingTable } from "./config/catalog.ts";
import { edgeConfig } from "./config/store.ts";
import type { Env } from "./env.ts";
import { type KeyRecord, modelAllowed } from "./keys/rules.ts";
import { errors } from "./openai-errors.ts";

/**
 * `GET /v1/models` and `GET /v1/models/{model}`: the names a key may use
 * that can answer now. Retrieving one is looking it up in that list, so a
 * name the list leaves out (no endpoint, none through a fallback, or not
 * the key's) is a 404, as OpenAI answers for a model one cannot use.
 */
type Ctx = Context<{ Bindings: Env }>;

interface ModelEntry {
  id: string;
  object: "model";
  created: number;
  owned_by: string;
  /** The model the name stands for, as vLLM lists each of several served names. */
  root: string;
}

function entries(table: RoutingTable, key: KeyRecord): ModelEntry[] {
  return table
    .servableNames()
    .filter(({ id, model }) => modelAllowed(key, model, id))
    .map(({ id, model }) => ({ id, object: "model", created: 0, owned_by: "llmgw", root: model }));
}

export async function listModels(c: Ctx): Promise<Response> {
  const key = await caller(c);
  const { table } = await edgeConfig(c.env);
  return c.json({ object: "list", data: entries(table, key) });
}

export async function retrieveModel(c: Ctx): Promise<Response> {
  const key = await caller(c);
  const { table } = await edgeConfig(c.env);
  // Names may hold slashes (`meta-llama/Llama-3.1-8B-Instruct`), sent raw or as %2F.
  const name = c.req.param("model") ?? "";
  const found = entries(table, key).find((m) => m.id === name);
  if (!found) throw errors.modelNotFound(name);
  return c.json(found);
}
