import type { Context } from "hono";
import { expired } from "../common/key-expiry.ts";
import type { Env } from "./env.ts";
import { authenticate } from "./keys/auth.ts";
import { revocationLog, revocationWatch } from "./keys/revocations.ts";
import type { KeyRecord } from "./keys/rules.ts";
import { errors } from "./openai-errors.ts";

/**
 * Who is calling: the key behind the Authorization header, refused if expired or
 * revoked. Revocation is checked against the isolate's view of the
 * RevocationLog, refreshed every few seconds by the request that finds it
 * due, in the background: that request goes on with the view it has, as
 * the ones beside it do, and the log may be far away. Only an isolate that
 * has no view yet waits for its first. If the log cannot be reached the
 * view is kept (fail open for that interval) rather than failing every
 * request. Synchronous when the key is cached and the view loaded, as on
 * nearly every request: under load each await is a resumption queued
 * behind other streams' chunks.
 */
export function caller(c: Context<{ Bindings: Env }>): KeyRecord | Promise<KeyRecord> {
  const defer = (p: Promise<unknown>) => c.executionCtx.waitUntil(p);
  const key = authenticate(c.req.header("authorization") ?? null, c.env.LLMGW_KV, defer);
  if (!revocationWatch.loaded) return checkedAfterRefresh(c.env, key);
  if (revocationWatch.due()) defer(refreshRevocations(c.env));
  return key instanceof Promise ? key.then(usable) : usable(key);
}

async function refreshRevocations(env: Env): Promise<void> {
  try {
    await revocationWatch.refresh((epoch) => revocationLog(env).since(epoch));
  } catch (err) {
    console.error("revocation log unreachable", err);
  }
}

async function checkedAfterRefresh(env: Env, pending: KeyRecord | Promise<KeyRecord>): Promise<KeyRecord> {
  const [key] = await Promise.all([pending, refreshRevocations(env)]);
  return usable(key);
}

function usable(key: KeyRecord): KeyRecord {
  if (revocationWatch.isRevoked(key.id)) throw errors.unauthorized("This API key has been revoked.");
  if (expired(key, Date.now())) {
    throw errors.unauthorized(`This API key expired at ${new Date(key.expires_at_unix_ms).toISOString()}.`);
  }
  return key;
}
