/**
 * The edge's configuration lives in KV (config, not live load): the
 * catalog, the endpoint set and the router settings, each a versioned
 * document written by EdgeSync. Each isolate (a Worker's or a ModelPool's)
 * keeps them parsed for a few seconds so the request path does not pay
 * three KV reads; the isolate that receives an EdgeSync write drops its
 * copy at once, others pick the change up within CACHE_MS (plus KV's own
 * propagation when deployed).
 */

import type { z } from "zod";
import { copyUse } from "../revalidation.ts";
import {
  catalogDocSchema,
  EMPTY_CATALOG,
  EMPTY_ENDPOINTS,
  type EndpointsDoc,
  endpointsDocSchema,
  RoutingTable,
} from "./catalog.ts";
import type { RouterConfig } from "./router.ts";
import { EMPTY_ROUTER_DOC, resolveSettings, routerDocSchema } from "./settings.ts";
import { DEFAULT_SITE, unionOf } from "./site-sets.ts";
import { readSiteIndex } from "./site-store.ts";
import { readStored } from "./stored-doc.ts";

export const CATALOG_KEY = "config/catalog";
/** The default site's endpoint set, where the single set was before sites; other sites' sets: site-store.ts. */
export const ENDPOINTS_KEY = "config/endpoints";
export const ROUTER_KEY = "config/router";
const CACHE_MS = 3_000;

export interface EdgeConfig {
  table: RoutingTable;
  settings: RouterConfig;
  /** The stored router document's version (0: none stored). */
  settingsVersion: number;
  /** Each site's endpoint set version; `table` routes over their union. */
  siteVersions: ReadonlyMap<string, number>;
}

export interface ConfigEnv {
  LLMGW_KV: KVNamespace;
  LLMGW_ROUTER?: string | undefined;
}

// Deliberately no shared in-flight load promise: in Workers, a promise
// driven by one request's I/O must not be awaited by another request.
let cached: { config: EdgeConfig; override: string | undefined; until: number } | undefined;
let refreshing = false;
// Counts invalidations: a read begun before one must not replace the copy
// a read begun after it has made.
let generation = 0;

/** A stored document, or `empty` when there is none or it no longer parses (stored-doc.ts). */
export async function readDoc<S extends z.ZodType>(
  kv: KVNamespace,
  key: string,
  schema: S,
  empty: z.output<S>,
): Promise<z.output<S>> {
  return (await readStored(kv, key, schema)) ?? empty;
}

/**
 * Synchronous while the isolate has a copy (no await on the request path);
 * a promise when KV must be read first. Past CACHE_MS, a caller that can
 * keep work alive past itself (`defer`: a request's waitUntil) re-reads KV
 * in the background and goes on with the copy; one that cannot waits.
 */
export function edgeConfig(
  env: ConfigEnv,
  defer?: (p: Promise<unknown>) => void,
): EdgeConfig | Promise<EdgeConfig> {
  if (cached && cached.override === env.LLMGW_ROUTER) {
    // Stale while one request revalidates: the others keep the old copy
    // rather than all reading KV at the same moment (revalidation.ts).
    const use = copyUse(cached.until, Date.now(), refreshing, defer !== undefined);
    if (use === "use") return cached.config;
    if (use === "use-and-reread" && defer) {
      defer(reload(env).catch((err) => console.error("config re-read failed", err)));
      return cached.config;
    }
  }
  return reload(env);
}

function reload(env: ConfigEnv): Promise<EdgeConfig> {
  refreshing = true;
  return load(env).finally(() => {
    refreshing = false;
  });
}

async function load(env: ConfigEnv): Promise<EdgeConfig> {
  const kv = env.LLMGW_KV;
  const begun = generation;
  const [catalog, sets, router] = await Promise.all([
    readDoc(kv, CATALOG_KEY, catalogDocSchema, EMPTY_CATALOG),
    readSiteSets(kv),
    readDoc(kv, ROUTER_KEY, routerDocSchema, EMPTY_ROUTER_DOC),
  ]);
  const config = {
    table: new RoutingTable(catalog, unionOf(sets)),
    settings: resolveSettings(router.settings, env.LLMGW_ROUTER),
    settingsVersion: router.version,
    siteVersions: new Map([...sets].map(([site, doc]) => [site, doc.version])),
  };
  if (begun === generation) cached = { config, override: env.LLMGW_ROUTER, until: Date.now() + CACHE_MS };
  return config;
}

/** Every site's endpoint set: the default site's, each site's the index names, and `also`'s even before the index names it. */
export async function readSiteSets(kv: KVNamespace, also?: string): Promise<Map<string, EndpointsDoc>> {
  const sites = [...new Set([DEFAULT_SITE, ...(await readSiteIndex(kv)), ...(also ? [also] : [])])];
  const docs = await Promise.all(
    sites.map((site) => readDoc(kv, endpointsKey(site), endpointsDocSchema, EMPTY_ENDPOINTS)),
  );
  return new Map(sites.map((site, i) => [site, docs[i]!]));
}

/** Where a site's endpoint set is stored: the default site's where the one set always was. */
export function endpointsKey(site: string): string {
  return site === DEFAULT_SITE ? ENDPOINTS_KEY : `config/sites/${site}/endpoints`;
}

/** Whatever this isolate holds is re-read from KV on next use. */
export function invalidateEdgeConfig(): void {
  cached = undefined;
  generation++;
}

/** The copy this isolate holds, fresh or not, without touching KV. */
export function cachedEdgeConfig(): EdgeConfig | undefined {
  return cached?.config;
}
