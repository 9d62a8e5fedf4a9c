import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { parseDuration } from "../../common/duration.ts";
import { formatPath } from "../../common/zod-issues.ts";
import type { ApiKey, EdgeSyncService } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import type { RouterConfig } from "../config/router.ts";
import { edgeConfig } from "../config/store.ts";
import { readStored } from "../config/stored-doc.ts";
import type { Env } from "../env.ts";
import { apiKeyOf, recordFields } from "../keys/api-key.ts";
import { keyCache, keyKvName } from "../keys/auth.ts";
import { revocationLog, revocationWatch } from "../keys/revocations.ts";
import { type KeyRecord, keyRecordSchema } from "../keys/rules.ts";
import { invalid } from "./errors.ts";

/**
 * EdgeSync's key calls: API keys (hashes only) into KV, revocation through
 * the key's ledger and the RevocationLog, and usage totals out.
 */
const KEY_ID_KV = (id: string) => `keyids/${id}`;

function ledger(env: Env, keyId: string) {
  return env.KEY_LEDGER.get(env.KEY_LEDGER.idFromName(keyId));
}

async function allKeys(kv: KVNamespace): Promise<KeyRecord[]> {
  const out: KeyRecord[] = [];
  let cursor: string | undefined;
  do {
    const page: KVNamespaceListResult<unknown, string> = await kv.list({ prefix: "keys/", cursor });
    const values = await Promise.all(page.keys.map((k) => readStored(kv, k.name, keyRecordSchema)));
    for (const v of values) if (v) out.push(v);
    cursor = page.list_complete ? undefined : page.cursor;
  } while (cursor);
  return out.sort((a, b) => a.created_at_unix_ms - b.created_at_unix_ms || a.id.localeCompare(b.id));
}

const KEY_ID = /^[A-Za-z0-9_-]{1,64}$/;

/** An id as PutKey accepts it, checked before it becomes part of a KV key name (at most 512 bytes). */
function keyId(id: string, field: string): string {
  if (!KEY_ID.test(id)) throw invalid(`${field}: must be 1-64 letters, digits, - or _`);
  return id;
}

async function keyById(kv: KVNamespace, id: string): Promise<KeyRecord | undefined> {
  const hash = await kv.get(KEY_ID_KV(id));
  if (!hash) return undefined;
  return (await readStored(kv, keyKvName(hash), keyRecordSchema)) ?? undefined;
}

function keyFromMessage(k: ApiKey | undefined, settings: RouterConfig): KeyRecord {
  if (!k) throw invalid("key: required");
  const bands = new Set(settings.admission.bands.map((b) => b.name));
  keyId(k.id, "key.id");
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
  const r = keyRecordSchema.safeParse({
    ...recordFields(k),
    hash: k.hash,
    budget_tokens: tokens,
    budget_period_ms: periodMs,
    created_at_unix_ms: Number(k.createdAtUnixMs) || Date.now(),
    expires_at_unix_ms: Number(k.expiresAtUnixMs),
    revoked: false,
  });
  if (r.success) return r.data;
  // What the checks above leave: numbers past 2^53 (a uint64 budget, a created_at in the far future).
  const issue = r.error.issues[0]!;
  throw invalid(`key.${formatPath(issue.path)}: ${issue.message}`);
}

type KeyCalls = Pick<ServiceImpl<typeof EdgeSyncService>, "putKey" | "revokeKey" | "listKeys" | "getUsage">;

export function keyCalls(env: Env): KeyCalls {
  const kv = env.LLMGW_KV;
  return {
    async putKey(req) {
      const key = keyFromMessage(req.key, (await edgeConfig(env)).settings);
      const existing = await kv.get(KEY_ID_KV(key.id));
      if (existing && existing !== key.hash) {
        throw new ConnectError(`key id ${key.id} already exists with another secret`, Code.AlreadyExists);
      }
      // The secret's record, whichever id it was put under: a secret belongs
      // to one key, and a revoked one stays revoked (its ledger and the
      // RevocationLog say so by id, for good; a record put back as active,
      // under that id or another, would bring the secret back).
      const held = await readStored(kv, keyKvName(key.hash), keyRecordSchema);
      if (held && held.id !== key.id) {
        throw new ConnectError(`this secret already belongs to key ${held.id}`, Code.AlreadyExists);
      }
      if (held?.revoked) {
        throw new ConnectError(`key ${key.id} is revoked; create a new key`, Code.FailedPrecondition);
      }
      await kv.put(keyKvName(key.hash), JSON.stringify(key));
      await kv.put(KEY_ID_KV(key.id), key.hash);
      keyCache.invalidate(key.hash);
      return {};
    },

    async revokeKey(req) {
      const key = await keyById(kv, keyId(req.id, "id"));
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
      return { keys: (await allKeys(kv)).map(apiKeyOf) };
    },

    async getUsage(req) {
      let keys: KeyRecord[];
      if (req.keyId) {
        const k = await keyById(kv, keyId(req.keyId, "key_id"));
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
            estimatedRequests: BigInt(u.estimated_requests),
            estimatedTokens: BigInt(u.estimated_tokens),
            revoked: u.revoked || k.revoked,
            expiresAtUnixMs: BigInt(k.expires_at_unix_ms),
          };
        }),
      );
      return { usage };
    },
  };
}
