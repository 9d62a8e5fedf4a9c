import {
  type CatalogDoc,
  catalogDocSchema,
  EMPTY_CATALOG,
  EMPTY_ENDPOINTS,
  type EndpointsDoc,
  endpointsDocSchema,
  RoutingTable,
} from "./catalog.ts";

/**
 * The catalog and endpoint set live in KV (config, not live load). Each
 * isolate keeps the parsed table for a few seconds so the request path does
 * not pay two KV reads; the isolate that receives an EdgeSync write drops
 * its copy at once, others pick the change up within CACHE_MS (plus KV's own
 * propagation when deployed).
 */
export const CATALOG_KEY = "config/catalog";
export const ENDPOINTS_KEY = "config/endpoints";
const CACHE_MS = 3_000;

// Deliberately no shared in-flight load promise: in Workers, a promise
// driven by one request's I/O must not be awaited by another request.
let cached: { table: RoutingTable; until: number } | undefined;

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

let refreshing = false;

/** Synchronous while the isolate's copy is fresh (no await on the request path); a promise when KV must be read. */
export function routingTable(kv: KVNamespace): RoutingTable | Promise<RoutingTable> {
  if (cached && cached.until > Date.now()) return cached.table;
  // Stale while one request revalidates: the others keep the old table
  // rather than all reading KV at the same moment.
  if (cached && refreshing) return cached.table;
  refreshing = true;
  return load(kv).finally(() => {
    refreshing = false;
  });
}

async function load(kv: KVNamespace): Promise<RoutingTable> {
  const [catalog, endpoints] = await Promise.all([
    readDoc<CatalogDoc>(kv, CATALOG_KEY, catalogDocSchema, EMPTY_CATALOG),
    readDoc<EndpointsDoc>(kv, ENDPOINTS_KEY, endpointsDocSchema, EMPTY_ENDPOINTS),
  ]);
  const table = new RoutingTable(catalog, endpoints);
  cached = { table, until: Date.now() + CACHE_MS };
  return table;
}

export function invalidateRoutingTable(): void {
  cached = undefined;
}
