/**
 * EdgeSync's configuration calls: the catalog, the endpoint set and the
 * router settings, each a versioned document in KV. A new endpoint set is
 * also handed to the pool of every model it touches, so routing follows at
 * once rather than after the pools' KV caches expire. An empty endpoint set
 * replaces a non-empty one only when the request says so (`allow_empty`):
 * a publisher that lost its view, e.g. a control plane just restarted,
 * must not be able to stop every request by accident.
 */

import type { ServiceImpl } from "@connectrpc/connect";
import { z } from "zod";
import { checkCatalogNames, modelNameSchema } from "../../common/catalog-names.ts";
import { spillGroupPriorityConflicts } from "../../common/endpoint-fields.ts";
import { formatPath } from "../../common/zod-issues.ts";
import type {
  EdgeSyncService,
  PutCatalogRequest,
  PutEndpointSetsRequest,
} from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { catalogModelSchema, type EndpointRecord, endpointRecordSchema } from "../config/catalog.ts";
import { parseRouterSection, resolveSettings, routerDocSchema, SettingsError } from "../config/settings.ts";
import { CATALOG_KEY, edgeConfig, invalidateEdgeConfig, ROUTER_KEY } from "../config/store.ts";
import { readStored } from "../config/stored-doc.ts";
import type { Env } from "../env.ts";
import type { Caller } from "./caller.ts";
import { invalid, nextVersion } from "./errors.ts";
import { putSiteSet } from "./site-write.ts";

/** A pushed model's name must be one the control plane's config accepts; stored documents are read as they were written. */
const pushedModelSchema = catalogModelSchema.extend({ name: modelNameSchema });

type ConfigCalls = Pick<
  ServiceImpl<typeof EdgeSyncService>,
  "putCatalog" | "putEndpointSets" | "putRouterSettings" | "getRouterSettings"
>;

const versionedSchema = z.object({ version: z.number().int().min(0) });

/** The stored document's version; 0 when there is none or it does not parse (logged, stored-doc.ts). */
async function storedVersion(kv: KVNamespace, key: string): Promise<number> {
  return (await readStored(kv, key, versionedSchema))?.version ?? 0;
}

export function configCalls(env: Env, caller: Caller): ConfigCalls {
  const kv = env.LLMGW_KV;
  return {
    async putCatalog(req) {
      const models = pushedModels(req.models);
      const { issues } = checkCatalogNames(models);
      if (issues.length > 0) throw invalid(issues.join("; "));
      const version = nextVersion(await storedVersion(kv, CATALOG_KEY), req.version);
      await kv.put(CATALOG_KEY, JSON.stringify({ version, models }));
      invalidateEdgeConfig();
      return { version: BigInt(version) };
    },

    async putEndpointSets(req) {
      const endpoints = pushedEndpoints(req.endpoints);
      const version = await putSiteSet(env, caller, req, endpoints);
      return { version: BigInt(version) };
    },

    async putRouterSettings(req) {
      const raw = pushedRouterSection(req.settingsJson, env.LLMGW_ROUTER);
      const version = nextVersion(await storedVersion(kv, ROUTER_KEY), req.version);
      await kv.put(ROUTER_KEY, JSON.stringify({ version, settings: raw }));
      invalidateEdgeConfig();
      return { version: BigInt(version) };
    },

    async getRouterSettings() {
      const stored = routerDocSchema.safeParse(await kv.get(ROUTER_KEY, "json")).data;
      invalidateEdgeConfig();
      const { settings } = await edgeConfig(env);
      return {
        storedJson: JSON.stringify(stored?.settings ?? {}),
        version: BigInt(stored?.version ?? 0),
        effectiveJson: JSON.stringify(settings),
      };
    },
  };
}

/** The pushed catalog's models, each checked as the control plane checks it; the first fault named by its path. */
function pushedModels(models: PutCatalogRequest["models"]) {
  return models.map((m, i) => {
    const r = pushedModelSchema.safeParse({
      name: m.name,
      aliases: m.aliases,
      fallbacks: m.fallbacks,
      routing: m.routing,
    });
    if (!r.success) {
      const issue = r.error.issues[0]!;
      throw invalid(`models[${i}].${formatPath(issue.path)}: ${issue.message}`);
    }
    return r.data;
  });
}

/** A pushed endpoint set as records: each checked, ids unique, one priority per spill group. */
function pushedEndpoints(endpoints: PutEndpointSetsRequest["endpoints"]): EndpointRecord[] {
  const ids = new Set<string>();
  const records = endpoints.map((e, i) => {
    const r = endpointRecordSchema.safeParse({
      id: e.id,
      url: e.url,
      models: e.models,
      pool: e.pool || undefined,
      weight: e.weight || undefined,
      priority: e.priority,
      via: e.via || undefined,
      max_num_seqs: e.maxNumSeqs || undefined,
      kv_tokens: e.kvTokens > 0n ? Number(e.kvTokens) : undefined,
      served_model_name: e.servedModelName || undefined,
      api_key: e.apiKey || undefined,
    });
    if (!r.success) {
      const issue = r.error.issues[0]!;
      throw invalid(`endpoints[${i}].${formatPath(issue.path)}: ${issue.message}`);
    }
    if (ids.has(r.data.id)) throw invalid(`endpoints[${i}].id: duplicate id "${r.data.id}"`);
    ids.add(r.data.id);
    return r.data;
  });
  const conflict = spillGroupPriorityConflicts(records)[0];
  if (conflict) throw invalid(`endpoints[${conflict.index}].priority: ${conflict.message}`);
  return records;
}

/**
 * A pushed `router:` section, checked with the Worker's own override laid
 * over it too, so a push cannot leave the edge with settings it would
 * refuse on every request.
 */
function pushedRouterSection(json: string, override: string | undefined): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = JSON.parse(json || "{}");
  } catch (err) {
    throw invalid(`settings_json: not JSON: ${(err as Error).message}`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw invalid("settings_json: must be a JSON object (the router: section)");
  }
  try {
    parseRouterSection(raw);
    resolveSettings(raw as Record<string, unknown>, override);
  } catch (err) {
    if (err instanceof SettingsError) throw invalid(`router: ${err.message}`);
    throw err;
  }
  return raw as Record<string, unknown>;
}
