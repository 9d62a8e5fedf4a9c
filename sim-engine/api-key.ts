/**
 * An engine's API keys, checked as vLLM and SGLang check them. What the two
 * share is here once: the secrets compared in constant time, and the
 * refusal (401 with `{"error":"Unauthorized"}`, the body both send). What
 * they differ in is each engine's own rule below: which paths need a key
 * and how the `Authorization` header is read.
 */
import { createHash, timingSafeEqual } from "node:crypto";

export const UNAUTHORIZED_STATUS = 401;
/** The refusal's body, byte for byte: Starlette's JSONResponse (vLLM) and ORJSONResponse (SGLang) write it compact. */
export const UNAUTHORIZED_BODY = '{"error":"Unauthorized"}';

const digest = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();

/**
 * Secrets, compared as vLLM's verify_token compares them: SHA-256 digests
 * (equal lengths, so nothing leaks the key's length) in constant time, and
 * every one of them, so the time says nothing of which matched.
 */
export class Secrets {
  private readonly digests: readonly Buffer[];

  constructor(secrets: readonly string[]) {
    this.digests = secrets.map(digest);
  }

  get size(): number {
    return this.digests.length;
  }

  has(given: string): boolean {
    const d = digest(given);
    let match = false;
    // timingSafeEqual first: `||` must not skip a comparison once one matched.
    for (const k of this.digests) match = timingSafeEqual(d, k) || match;
    return match;
  }
}

/**
 * vLLM's rule (AuthenticationMiddleware, vllm/entrypoints/openai/
 * server_utils.py, formerly in api_server.py): with keys, a request whose
 * path starts with `/v1` needs `Authorization: <scheme> <key>`, the scheme
 * `bearer` in any case and the key everything after the first space, equal
 * to one of the keys; OPTIONS and every other path (/health, /metrics,
 * /version, /ping) pass. Without keys everything passes, whatever the header.
 */
export function vllmAuthorized(
  keys: Secrets,
  path: string,
  method: string,
  authorization: string | undefined,
): boolean {
  if (keys.size === 0 || method === "OPTIONS" || !path.startsWith("/v1")) return true;
  if (!authorization) return false;
  const space = authorization.indexOf(" ");
  const scheme = space < 0 ? authorization : authorization.slice(0, space);
  if (scheme.toLowerCase() !== "bearer") return false;
  return keys.has(space < 0 ? "" : authorization.slice(space + 1));
}

/** SGLang's one `--api-key`, as the whole header it must equal (`Bearer KEY`); none without a key. */
export function sglangSecrets(apiKey: string | undefined): Secrets {
  return new Secrets(apiKey === undefined ? [] : [`Bearer ${apiKey}`]);
}

/**
 * SGLang's rule (add_api_key_middleware, python/sglang/srt/utils): with a
 * key, every path but those starting `/health` or `/metrics` needs the
 * header to be exactly `Bearer KEY` (scheme, case and spacing included);
 * OPTIONS passes. `bearer` is from sglangSecrets.
 */
export function sglangAuthorized(
  bearer: Secrets,
  path: string,
  method: string,
  authorization: string | undefined,
): boolean {
  if (bearer.size === 0 || method === "OPTIONS") return true;
  if (path.startsWith("/health") || path.startsWith("/metrics")) return true;
  return authorization !== undefined && bearer.has(authorization);
}
