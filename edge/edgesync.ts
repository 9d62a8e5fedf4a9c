import { Code, ConnectError, createConnectRouter, type ServiceImpl } from "@connectrpc/connect";
import {
  universalServerRequestFromFetch,
  universalServerResponseToFetch,
} from "@connectrpc/connect/protocol";
import { parseDuration } from "../common/duration.ts";
import type { RouterConfig } from "../controlplane/config/schema.ts";
import { type ApiKey, EdgeSyncService, type EndpointLoad } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { keyCache, keyKvName, secretsEqual } from "./auth.ts";
import { catalogModelSchema, endpointRecordSchema } from "./catalog.ts";
import { CATALOG_KEY, ENDPOINTS_KEY, invalidateRoutingTable } from "./config-store.ts";
import type { Env } from "./env.ts";
import { type KeyRecord, keyRecordSchema } from "./key-rules.ts";
import { revocationLog, revocationWatch } from "./revocations.ts";

/**
 * EdgeSync: the control plane's (and the CLI's) way in. Hosted at the
 * Connect paths `/edge.v1.EdgeSyncService/<Method>`, unary only, behind a
 * bearer secret (`EDGE_SYNC_TOKEN`) compared in constant time.
 */
export const EDGESYNC_PREFIX = `/${EdgeSyncService.typeName}/`;

const KEY_ID_KV = (id: string) => `keyids/${id}`;

/** Last load snapshot per endpoint; the ModelPool issue moves this into the pool DO. */
export const loadSnapshots = new Map<string, { load: Record<string, unknown>; receivedAt: number }>();

function invalid(message: string): ConnectError {
  return new ConnectError(message, Code.InvalidArgument);
}

function issuePath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const p of path) out += typeof p === "number" ? `[${p}]` : out ? `.${String(p)}` : String(p);
  return out;
}

async function nextVersion(kv: KVNamespace, key: string, requested: bigint): Promise<number> {
  const current = (await kv.get<{ version: number }>(key, "json"))?.version ?? 0;
  if (requested === 0n) return current + 1;
  const v = Number(requested);
  if (v <= current) {
    throw new ConnectError(
      `version ${v} is not newer than the stored version ${current}`,
      Code.FailedPrecondition,
    );
  }
  return v;
}

function ledger(env: Env, keyId: string) {
  return env.KEY_LEDGER.get(env.KEY_LEDGER.idFromName(keyId));
}

function toApiKey(k: KeyRecord) {
  return {
    id: k.id,
    hash: k.hash,
    name: k.name,
    tenant: k.tenant,
    maxBand: k.max_band,
    defaultBand: k.default_band,
    models: k.models,
    rpm: k.rpm,
    tpm: k.tpm,
    budget:
      k.budget_tokens > 0
        ? { tokens: BigInt(k.budget_tokens), period: formatPeriod(k.budget_period_ms) }
        : undefined,
    createdAtUnixMs: BigInt(k.created_at_unix_ms),
    revoked: k.revoked,
  };
}

function formatPeriod(ms: number): string {
  if (ms % 86_400_000 === 0) return `${ms / 86_400_000}d`;
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  return `${ms / 1000}s`;
}

async function allKeys(kv: KVNamespace): Promise<KeyRecord[]> {
  const out: KeyRecord[] = [];
  let cursor: string | undefined;
  do {
    const page: KVNamespaceListResult<unknown, string> = await kv.list({ prefix: "keys/", cursor });
    const values = await Promise.all(page.keys.map((k) => kv.get(k.name, "json")));
    for (const v of values) {
      const r = keyRecordSchema.safeParse(v);
      if (r.success) out.push(r.data);
    }
    cursor = page.list_complete ? undefined : page.cursor;
  } while (cursor);
  return out.sort((a, b) => a.created_at_unix_ms - b.created_at_unix_ms || a.id.localeCompare(b.id));
}

async function keyById(kv: KVNamespace, id: string): Promise<KeyRecord | undefined> {
  const hash = await kv.get(KEY_ID_KV(id));
  if (!hash) return undefined;
  const r = keyRecordSchema.safeParse(await kv.get(keyKvName(hash), "json"));
  return r.success ? r.data : undefined;
}

function keyFromMessage(k: ApiKey | undefined, settings: RouterConfig): KeyRecord {
  if (!k) throw invalid("key: required");
  const bands = new Set(settings.admission.bands.map((b) => b.name));
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(k.id)) throw invalid("key.id: must be 1-64 letters, digits, - or _");
  if (!/^[0-9a-f]{64}$/.test(k.hash)) throw invalid("key.hash: must be a lower-case hex SHA-256");
  if (!bands.has(k.maxBand)) throw invalid(`key.max_band: must be one of ${[...bands].join(", ")}`);
  if (k.defaultBand && !bands.has(k.defaultBand)) {
    throw invalid(`key.default_band: must be one of ${[...bands].join(", ")}`);
  }
  let periodMs = 0;
  let tokens = 0;
  if (k.budget && k.budget.tokens > 0n) {
    tokens = Number(k.budget.tokens);
    try {
      periodMs = parseDuration(k.budget.period);
    } catch (err) {
      throw invalid(`key.budget.period: ${(err as Error).message}`);
    }
    if (periodMs <= 0) throw invalid("key.budget.period: must be positive");
  }
  return keyRecordSchema.parse({
    id: k.id,
    hash: k.hash,
    name: k.name,
    tenant: k.tenant,
    max_band: k.maxBand,
    default_band: k.defaultBand,
    models: k.models,
    rpm: k.rpm,
    tpm: k.tpm,
    budget_tokens: tokens,
    budget_period_ms: periodMs,
    created_at_unix_ms: Number(k.createdAtUnixMs) || Date.now(),
    revoked: false,
  });
}

export function edgeSyncImpl(env: Env, settings: RouterConfig): ServiceImpl<typeof EdgeSyncService> {
  const kv = env.LLMGW_KV;
  return {
    async putCatalog(req) {
      const models = req.models.map((m, i) => {
        const r = catalogModelSchema.safeParse({
          name: m.name,
          aliases: m.aliases,
          fallbacks: m.fallbacks,
          routing: m.routing,
        });
        if (!r.success || !m.name) throw invalid(`models[${i}].name: required`);
        return r.data;
      });
      const names = new Set<string>();
      for (const [i, m] of models.entries()) {
        if (names.has(m.name)) throw invalid(`models[${i}].name: duplicate model "${m.name}"`);
        names.add(m.name);
      }
      for (const [i, m] of models.entries()) {
        for (const a of m.aliases) {
          if (names.has(a)) throw invalid(`models[${i}].aliases: "${a}" is already a name or alias`);
          names.add(a);
        }
      }
      for (const [i, m] of models.entries()) {
        for (const f of m.fallbacks) {
          if (!names.has(f)) throw invalid(`models[${i}].fallbacks: unknown model "${f}"`);
        }
      }
      const version = await nextVersion(kv, CATALOG_KEY, req.version);
      await kv.put(CATALOG_KEY, JSON.stringify({ version, models }));
      invalidateRoutingTable();
      return { version: BigInt(version) };
    },

    async putEndpointSets(req) {
      const ids = new Set<string>();
      const endpoints = req.endpoints.map((e, i) => {
        const r = endpointRecordSchema.safeParse({
          id: e.id,
          url: e.url,
          models: e.models,
          pool: e.pool || undefined,
          weight: e.weight || undefined,
          priority: e.priority,
          via: e.via || undefined,
        });
        if (!r.success) {
          const issue = r.error.issues[0]!;
          throw invalid(`endpoints[${i}].${issuePath(issue.path)}: ${issue.message}`);
        }
        if (ids.has(r.data.id)) throw invalid(`endpoints[${i}].id: duplicate id "${r.data.id}"`);
        ids.add(r.data.id);
        return r.data;
      });
      const version = await nextVersion(kv, ENDPOINTS_KEY, req.version);
      await kv.put(ENDPOINTS_KEY, JSON.stringify({ version, endpoints }));
      invalidateRoutingTable();
      return { version: BigInt(version) };
    },

    async putKey(req) {
      const key = keyFromMessage(req.key, settings);
      const existing = await kv.get(KEY_ID_KV(key.id));
      if (existing && existing !== key.hash) {
        throw new ConnectError(`key id ${key.id} already exists with another secret`, Code.AlreadyExists);
      }
      await kv.put(keyKvName(key.hash), JSON.stringify(key));
      await kv.put(KEY_ID_KV(key.id), key.hash);
      keyCache.invalidate(key.hash);
      return {};
    },

    async revokeKey(req) {
      const key = await keyById(kv, req.id);
      if (!key) throw new ConnectError(`no key with id ${req.id}`, Code.NotFound);
      // The ledger first: it is what every admission consults, so the key
      // stops working everywhere the moment this call returns. KV follows
      // for isolates that would otherwise keep a cached copy.
      await Promise.all([ledger(env, key.id).revoke(), revocationLog(env).record(key.id)]);
      revocationWatch.add(key.id);
      await kv.put(keyKvName(key.hash), JSON.stringify({ ...key, revoked: true }));
      keyCache.invalidate(key.hash);
      return {};
    },

    async listKeys() {
      return { keys: (await allKeys(kv)).map(toApiKey) };
    },

    async pushLoad(req) {
      const at = Date.now();
      for (const l of req.loads as EndpointLoad[]) {
        if (!l.endpointId) continue;
        loadSnapshots.set(l.endpointId, {
          load: {
            waiting: l.waiting,
            running: l.running,
            kvUsage: l.kvUsage,
            prefixCacheHitRate: l.prefixCacheHitRate,
            scrapedAtUnixMs: Number(l.scrapedAtUnixMs),
            state: l.state,
          },
          receivedAt: at,
        });
      }
      return {};
    },

    async getUsage(req) {
      let keys: KeyRecord[];
      if (req.keyId) {
        const k = await keyById(kv, req.keyId);
        if (!k) throw new ConnectError(`no key with id ${req.keyId}`, Code.NotFound);
        keys = [k];
      } else keys = await allKeys(kv);
      const usage = await Promise.all(
        keys.map(async (k) => {
          const u = await ledger(env, k.id).usage();
          return {
            keyId: k.id,
            name: k.name,
            requests: BigInt(u.requests),
            promptTokens: BigInt(u.prompt_tokens),
            completionTokens: BigInt(u.completion_tokens),
            totalTokens: BigInt(u.total_tokens),
            budgetUsed: BigInt(u.budget_used),
            budgetTokens: BigInt(k.budget_tokens),
            partialRequests: BigInt(u.partial_requests),
            revoked: u.revoked || k.revoked,
          };
        }),
      );
      return { usage };
    },
  };
}

function connectError(status: number, code: string, message: string): Response {
  return new Response(JSON.stringify({ code, message }), {
    status,
    headers: { "content-type": "application/json" },
  });
}

/** Serves one EdgeSync call, or refuses it without revealing anything. */
export async function handleEdgeSync(req: Request, env: Env, settings: RouterConfig): Promise<Response> {
  const expected = env.EDGE_SYNC_TOKEN;
  if (!expected) return connectError(503, "unavailable", "EdgeSync is disabled: EDGE_SYNC_TOKEN is not set");
  const auth = req.headers.get("authorization") ?? "";
  const m = /^Bearer (\S+)$/.exec(auth);
  if (!m || !(await secretsEqual(m[1]!, expected))) {
    return connectError(401, "unauthenticated", "missing or wrong EdgeSync bearer token");
  }
  const router = createConnectRouter({ connect: true, grpc: false, grpcWeb: false });
  router.service(EdgeSyncService, edgeSyncImpl(env, settings));
  const path = new URL(req.url).pathname;
  const handler = router.handlers.find((h) => h.requestPath === path);
  if (!handler) return connectError(404, "unimplemented", `no such method: ${path}`);
  const res = await handler(universalServerRequestFromFetch(req, {}));
  return universalServerResponseToFetch(res);
}
