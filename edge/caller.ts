import type { Context } from "hono";
import type { Env } from "./env.ts";
import { authenticate } from "./keys/auth.ts";
import { revocationLog, revocationWatch } from "./keys/revocations.ts";
import type { KeyRecord } from "./keys/rules.ts";
import { errors } from "./openai-errors.ts";

/**
 * Who is calling: the key behind the Authorization header, refused if
 * revoked. Revocation is checked against the isolate's view of the
 * RevocationLog, refreshed at most every few seconds; if the log cannot be
 * reached the view is kept (fail open for that interval) rather than
 * failing every request. Synchronous when the key is cached and no refresh
 * is due, as on most requests: under load each await is a resumption
 * queued behind other streams' chunks.
 */
export function caller(c: Context<{ Bindings: Env }>): KeyRecord | Promise<KeyRecord> {
  const key = authenticate(c.req.header("authorization") ?? null, c.env.LLMGW_KV);
  if (key instanceof Promise || revocationWatch.due()) return checkedAfterRefresh(c.env, key);
  return notRevoked(key);
}

async function checkedAfterRefresh(env: Env, pending: KeyRecord | Promise<KeyRecord>): Promise<KeyRecord> {
  const key = await pending;
  try {
    await revocationWatch.refresh((epoch) => revocationLog(env).since(epoch));
  } catch (err) {
    console.error("revocation log unreachable", err);
  }
  return notRevoked(key);
}

function notRevoked(key: KeyRecord): KeyRecord {
  if (revocationWatch.isRevoked(key.id)) throw errors.unauthorized("This API key has been revoked.");
  return key;
}
