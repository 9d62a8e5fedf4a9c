/**
 * API-key authentication. Keys look like `sk-<base64url>`; the edge stores
 * and looks up only their SHA-256. A brief per-isolate cache saves a KV read
 * per request; it is not what makes revocation fast. A revoked key is
 * refused everywhere within seconds through the RevocationLog every isolate
 * polls (revocations.ts), and at once by its KeyLedger when the key has
 * limits, since those keys are admitted by the ledger (ledger.ts).
 */

import { parseStored } from "../config/stored-doc.ts";
import { errors } from "../openai-errors.ts";
import { copyUse } from "../revalidation.ts";
import { type KeyRecord, keyRecordSchema } from "./rules.ts";
import { sha256Hex } from "./sha256.ts";

const KEY_FORMAT = /^sk-[A-Za-z0-9_-]{16,256}$/;
const POSITIVE_TTL_MS = 10_000;
// Short so a key created through another isolate works within seconds,
// long enough that a flood of bad keys costs one KV read per key per second.
const NEGATIVE_TTL_MS = 2_000;
const MAX_ENTRIES = 10_000;

export function bearerSecret(header: string | null): string {
  if (header === null || header.trim() === "") {
    throw errors.unauthorized(
      "You didn't provide an API key. Send it as an `Authorization: Bearer sk-...` header.",
    );
  }
  const m = /^Bearer ([^\s,]+)$/i.exec(header.trim());
  if (!m) throw errors.unauthorized("Malformed Authorization header; expected `Bearer sk-...`.");
  const secret = m[1]!;
  if (!KEY_FORMAT.test(secret)) throw errors.unauthorized("Incorrect API key provided (malformed key).");
  return secret;
}

const encoder = new TextEncoder();

/**
 * Compares two secrets in time independent of where they differ: both are
 * hashed first, so lengths leak nothing either, then every byte is visited.
 */
export async function secretsEqual(a: string, b: string): Promise<boolean> {
  const [da, db] = await Promise.all([
    crypto.subtle.digest("SHA-256", encoder.encode(a)),
    crypto.subtle.digest("SHA-256", encoder.encode(b)),
  ]);
  const x = new Uint8Array(da);
  const y = new Uint8Array(db);
  let diff = 0;
  for (let i = 0; i < x.length; i++) diff |= x[i]! ^ y[i]!;
  return diff === 0;
}

interface Entry {
  key: KeyRecord | null;
  until: number;
  refreshing?: boolean;
}

/** A cached key to use now; `reread`: this caller should re-read it, without waiting. */
export interface CacheHit {
  key: KeyRecord | null;
  reread: boolean;
}

export class KeyCache {
  private readonly entries = new Map<string, Entry>();
  constructor(private readonly now: () => number = Date.now) {}

  /**
   * The cached record, or undefined when the caller must read KV before it
   * goes on (revalidation.ts). A known key past its TTL is served while one
   * caller re-reads it (`reread`), so no request waits on KV for a key in
   * use; an unknown key past its TTL is read again by one caller while the
   * others are served the old answer, and that caller waits, so a key
   * created elsewhere works at once.
   */
  get(hash: string): CacheHit | undefined {
    const e = this.entries.get(hash);
    if (!e) return undefined;
    const use = copyUse(e.until, this.now(), e.refreshing === true, e.key !== null);
    if (use === "use") return { key: e.key, reread: false };
    e.refreshing = true;
    return use === "use-and-reread" ? { key: e.key, reread: true } : undefined;
  }

  set(hash: string, key: KeyRecord | null): void {
    if (this.entries.size >= MAX_ENTRIES) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(hash, { key, until: this.now() + (key ? POSITIVE_TTL_MS : NEGATIVE_TTL_MS) });
  }

  /** A re-read failed: let the next caller try again. */
  abandon(hash: string): void {
    const e = this.entries.get(hash);
    if (e) e.refreshing = false;
  }

  invalidate(hash: string): void {
    this.entries.delete(hash);
  }
}

export const keyCache = new KeyCache();

export function keyKvName(hash: string): string {
  return `keys/${hash}`;
}

/**
 * The key behind an Authorization header. Synchronous when this isolate
 * has the key cached (the common case: no await on the request path), and
 * when it is due to be re-read: `defer` keeps that read alive past the
 * request. A promise when KV must be read first. Throws (or rejects with)
 * a 401 for a malformed, unknown or revoked key.
 */
export function authenticate(
  header: string | null,
  kv: KVNamespace,
  defer: (p: Promise<unknown>) => void,
): KeyRecord | Promise<KeyRecord> {
  const hash = sha256Hex(bearerSecret(header));
  const hit = keyCache.get(hash);
  if (hit === undefined) return readKey(kv, hash).then(usable);
  if (hit.reread) defer(readKey(kv, hash).catch((err) => console.error("key re-read failed", err)));
  return usable(hit.key);
}

function usable(key: KeyRecord | null): KeyRecord {
  if (!key || key.revoked) throw errors.unauthorized("Incorrect API key provided.");
  return key;
}

async function readKey(kv: KVNamespace, hash: string): Promise<KeyRecord | null> {
  let text: string | null;
  try {
    text = await kv.get(keyKvName(hash), "text");
  } catch (err) {
    keyCache.abandon(hash);
    throw err;
  }
  const key = parseStored(keyKvName(hash), text, keyRecordSchema);
  keyCache.set(hash, key);
  return key;
}
