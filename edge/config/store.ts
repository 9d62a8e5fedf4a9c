/**
 * The edge's configuration lives in KV (config, not live load): the
 * catalog, the endpoint set and the router settings, each a versioned
 * document written by EdgeSync. Each isolate (a Worker's or a ModelPool's)
 * keeps them parsed for a few seconds so the request path does not pay
 * three KV reads; the isolate that receives an EdgeSync write drops its
 * copy at once, others pick the change up within CACHE_MS (plus KV's own
 * propagation when deployed).
 */
import {
  type CatalogDoc,
  catalogDocSchema,
  EMPTY_CATALOG,
  EMPTY_ENDPOINTS,
  type EndpointsDoc,
  endpointsDocSchema,
  RoutingTable,
} from "./catalog.ts";
import type { RouterConfig } from "./router.ts";
import { EMPTY_ROUTER_DOC, type RouterDoc, resolveSettings, routerDocSchema } from "./settings.ts";

export const CATALOG_KEY = "config/catalog";
export const ENDPOINTS_KEY = "config/endpoints";
export const ROUTER_KEY = "config/router";
const CACHE_MS = 3_000;

export interface EdgeConfig {
  table: RoutingTable;
  settings: RouterConfig;
  /** The stored router document's version (0: none stored). */
  settingsVersion: number;
}

export interface ConfigEnv {
  LLMGW_KV: KVNamespace;
  LLMGW_ROUTER?: string | undefined;
}

// Deliberately no shared in-flight load promise: in Workers, a promise
// driven by one request's I/O must not be awaited by another request.
let cached: { config: EdgeConfig; override: string | undefined; until: number } | undefined;
let refreshing = false;

async function readDoc<T>(
  kv: KVNamespace,
  key: string,
  schema: { safeParse(v: unknown): { success: true; data: T } | { success: false } },
  empty: T,
): Promise<T> {
  const raw = await kv.get(key, "json");
  if (raw === null) return empty;
  const r = schema.safeParse(raw);
  return r.success ? r.data : empty;
}

/** Synchronous while the isolate's copy is fresh (no await on the request path); a promise when KV must be read. */
export function edgeConfig(env: ConfigEnv): EdgeConfig | Promise<EdgeConfig> {
  if (cached && cached.override === env.LLMGW_ROUTER) {
    if (cached.until > Date.now()) return cached.config;
    // Stale while one request revalidates: the others keep the old copy
    // rather than all reading KV at the same moment.
    if (refreshing) return cached.config;
  }
  refreshing = true;
  return load(env).finally(() => {
    refreshing = false;
  });
}

async function load(env: ConfigEnv): Promise<EdgeConfig> {
  const kv = env.LLMGW_KV;
  const [catalog, endpoints, router] = await Promise.all([
    readDoc<CatalogDoc>(kv, CATALOG_KEY, catalogDocSchema, EMPTY_CATALOG),
    readDoc<EndpointsDoc>(kv, ENDPOINTS_KEY, endpointsDocSchema, EMPTY_ENDPOINTS),
    readDoc<RouterDoc>(kv, ROUTER_KEY, routerDocSchema, EMPTY_ROUTER_DOC),
  ]);
  const config = {
    table: new RoutingTable(catalog, endpoints),
    settings: resolveSettings(router.settings, env.LLMGW_ROUTER),
    settingsVersion: router.version,
  };
  cached = { config, override: env.LLMGW_ROUTER, until: Date.now() + CACHE_MS };
  return config;
}

/** Whatever this isolate holds is re-read from KV on next use. */
export function invalidateEdgeConfig(): void {
  cached = undefined;
}

/** The copy this isolate holds, fresh or not, without touching KV. */
export function cachedEdgeConfig(): EdgeConfig | undefined {
  return cached?.config;
}
