import { z } from "zod";
import { DEFAULT_SPILL_GROUP, viaSchema } from "../../common/endpoint-fields.ts";
import { engineKeySchema } from "../../common/static-endpoint.ts";
import type { EndpointSpec } from "../routing/types.ts";
import { ROUTING_POLICIES, type RoutingPolicy } from "./router.ts";

/**
 * What the edge knows about models and engines: the catalog (names,
 * aliases, fallbacks, routing) and the endpoint set, each a versioned
 * document written by EdgeSync. Pure: built from the two documents, queried
 * per request.
 */
export const endpointRecordSchema = z.object({
  id: z.string().min(1).max(128),
  url: z.url({ protocol: /^https?$/ }),
  models: z.array(z.string().min(1)).min(1),
  /** The endpoint's spill group (common/endpoint-fields.ts). */
  pool: z.string().default(DEFAULT_SPILL_GROUP),
  weight: z.number().positive().default(1),
  priority: z.number().int().default(0),
  via: viaSchema.default("direct"),
  max_num_seqs: z.number().int().positive().optional(),
  kv_tokens: z.number().int().positive().optional(),
  /** The model name this engine is sent instead of the catalog's. */
  served_model_name: z.string().min(1).max(256).optional(),
  /**
   * The bearer key the engine requires (vLLM's and SGLang's `--api-key`),
   * sent as its Authorization header; the rule is the pushers' own
   * (common/static-endpoint.ts). It stays in the record: endpointSpec()
   * leaves it out, so it never reaches the pools, and the proxy finds it
   * with RoutingTable.engineKeyOf().
   */
  api_key: engineKeySchema.optional(),
});
export type EndpointRecord = z.output<typeof endpointRecordSchema>;

/**
 * What routing needs of a record: everything but the models it serves and
 * the engine's key. The spec travels to the model's pool and back out in its
 * status, so the key is never copied into it.
 */
export function endpointSpec(e: EndpointRecord & { site?: string }): EndpointSpec {
  const spec: EndpointSpec = {
    id: e.id,
    ...(e.site ? { site: e.site } : {}),
    url: e.url,
    spillGroup: e.pool,
    priority: e.priority,
    weight: e.weight,
    via: e.via,
    ...(e.served_model_name ? { servedModelName: e.served_model_name } : {}),
  };
  if (e.max_num_seqs || e.kv_tokens) spec.capacity = { maxSeqs: e.max_num_seqs, kvTokens: e.kv_tokens };
  return spec;
}

export const catalogModelSchema = z.object({
  name: z.string().min(1),
  aliases: z.array(z.string()).default([]),
  fallbacks: z.array(z.string()).default([]),
  // Empty: router.default_routing.
  routing: z.union([z.enum(ROUTING_POLICIES), z.literal("")]).default(""),
});
export type CatalogModel = z.output<typeof catalogModelSchema>;

export const catalogDocSchema = z.object({
  version: z.number().int().min(0),
  models: z.array(catalogModelSchema),
});
export const endpointsDocSchema = z.object({
  version: z.number().int().min(0),
  endpoints: z.array(endpointRecordSchema),
});
export type CatalogDoc = z.output<typeof catalogDocSchema>;
export type EndpointsDoc = z.output<typeof endpointsDocSchema>;

export const EMPTY_CATALOG: CatalogDoc = { version: 0, models: [] };
export const EMPTY_ENDPOINTS: EndpointsDoc = { version: 0, endpoints: [] };

export class RoutingTable {
  private readonly canonical = new Map<string, string>();
  private readonly byModel = new Map<string, EndpointRecord[]>();
  private readonly models = new Map<string, CatalogModel>();
  private readonly endpointModels = new Map<string, string[]>();
  private readonly endpointSites = new Map<string, string>();
  private readonly engineKeys = new Map<string, string>();

  constructor(
    readonly catalog: CatalogDoc,
    readonly endpoints: EndpointsDoc,
  ) {
    for (const m of catalog.models) {
      this.models.set(m.name, m);
      this.canonical.set(m.name, m.name);
    }
    // Aliases after names, so an alias can never shadow a real model name.
    for (const m of catalog.models) {
      for (const a of m.aliases) if (!this.canonical.has(a)) this.canonical.set(a, m.name);
    }
    for (const e of endpoints.endpoints) {
      const served: string[] = [];
      for (const name of e.models) {
        // Router-only mode: a model named only by an endpoint is known too.
        if (!this.canonical.has(name)) this.canonical.set(name, name);
        const model = this.canonical.get(name)!;
        if (served.includes(model)) continue;
        served.push(model);
        const list = this.byModel.get(model) ?? [];
        list.push(e);
        this.byModel.set(model, list);
      }
      this.endpointModels.set(e.id, served);
      const site = (e as { site?: string }).site;
      if (site) this.endpointSites.set(e.id, site);
      if (e.api_key) this.engineKeys.set(e.id, e.api_key);
    }
  }

  /** The canonical model for a requested name or alias, or undefined if unknown. */
  resolve(name: string): string | undefined {
    return this.canonical.get(name);
  }

  /** The models an endpoint serves, canonical names. */
  modelsOfEndpoint(id: string): string[] {
    return this.endpointModels.get(id) ?? [];
  }

  /** The site that published an endpoint of the union (edge/config/site-sets.ts); undefined for a record without one. */
  siteOfEndpoint(id: string): string | undefined {
    return this.endpointSites.get(id);
  }

  /** Whether the endpoint is in the set (a lease may name one from the pool's newer set). */
  hasEndpoint(id: string): boolean {
    return this.endpointModels.has(id);
  }

  /**
   * The bearer key the endpoint's engine requires, by its id in the union:
   * a site's endpoint under its qualified id (`id@site`, site-sets.ts), as
   * leases name it. Undefined for one without a key, or not in the set.
   */
  engineKeyOf(id: string): string | undefined {
    return this.engineKeys.get(id);
  }

  endpointsFor(model: string): readonly EndpointRecord[] {
    return this.byModel.get(model) ?? [];
  }

  /** The model followed by its fallbacks, each resolved, without repeats. */
  chain(model: string): string[] {
    const out = [model];
    for (const f of this.models.get(model)?.fallbacks ?? []) {
      const c = this.resolve(f);
      if (c && !out.includes(c)) out.push(c);
    }
    return out;
  }

  /** The model's routing policy: its own, else the router's default. */
  policy(model: string, fallback: RoutingPolicy): RoutingPolicy {
    return this.models.get(model)?.routing || fallback;
  }

  /**
   * Every name a request may use now — model names and aliases — whose
   * model has an endpoint of its own or through a fallback, sorted, each
   * with the model it resolves to. A model without either would only
   * answer 503, so it is not offered (`GET /v1/models`).
   */
  servableNames(): { id: string; model: string }[] {
    const out: { id: string; model: string }[] = [];
    for (const [id, model] of this.canonical)
      if (this.chain(model).some((m) => this.endpointsFor(m).length > 0)) out.push({ id, model });
    return out.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** Every canonical model name, sorted. */
  modelNames(): string[] {
    return [...new Set(this.canonical.values())].sort();
  }
}
