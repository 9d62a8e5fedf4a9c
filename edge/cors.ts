import type { MiddlewareHandler } from "hono";
import { edgeConfig } from "./config/store.ts";
import type { Env } from "./env.ts";

/**
 * Cross-origin access to the OpenAI surface, so a web page can call the
 * gateway as it calls OpenAI or vLLM (both answer any origin by default).
 * Keys are bearer tokens, never cookies, so allowing an origin lets a page
 * use only a key it already holds; credentials are never allowed. A
 * request without an `Origin` header, every server-side client's, is left
 * alone and pays nothing.
 */

/** What a browser may read of an answer: the request id to quote, how it was routed, when to retry, and the key's standing. */
export const EXPOSED_HEADERS = [
  "x-request-id",
  "x-llmgw-band",
  "x-llmgw-attempts",
  "x-llmgw-endpoint",
  "x-llmgw-route",
  "x-llmgw-admitted",
  "x-llmgw-queued-ms",
  "retry-after",
  // The openai package waits this rather than Retry-After when it is there.
  "retry-after-ms",
  ...["limit", "remaining", "reset"].flatMap((k) => [`x-ratelimit-${k}-requests`, `x-ratelimit-${k}-tokens`]),
].join(", ");

// How long a browser may keep a preflight's answer: also how long a page
// whose origin is taken off the list can still send requests (it can no
// longer read the answers). Ten minutes: one preflight per page for most
// sessions, and a narrowed list that holds soon enough.
const PREFLIGHT_MAX_AGE_S = 600;

/** The `Access-Control-Allow-Origin` an origin gets, or undefined if it is not allowed. */
export function allowedOrigin(origin: string, allowed: readonly string[]): string | undefined {
  if (allowed.includes("*")) return "*";
  return allowed.includes(origin) ? origin : undefined;
}

/** Headers for an actual request's answer from an allowed origin. */
export function responseHeaders(allow: string): Record<string, string> {
  return {
    "access-control-allow-origin": allow,
    "access-control-expose-headers": EXPOSED_HEADERS,
    ...(allow === "*" ? {} : { vary: "Origin" }),
  };
}

/**
 * A preflight's answer: the methods the surface has, and the headers the
 * browser asked to send, echoed, since the client decides them (the openai
 * package adds its own `x-stainless-*`) and a wildcard would not cover
 * `Authorization`.
 */
export function preflightHeaders(
  allow: string,
  requestedHeaders: string | undefined,
): Record<string, string> {
  return {
    "access-control-allow-origin": allow,
    "access-control-allow-methods": "GET, POST",
    ...(requestedHeaders ? { "access-control-allow-headers": requestedHeaders } : {}),
    "access-control-max-age": String(PREFLIGHT_MAX_AGE_S),
    vary: allow === "*" ? "Access-Control-Request-Headers" : "Origin, Access-Control-Request-Headers",
  };
}

/** `router.cors` applied to the routes it is mounted on. */
export const cors: MiddlewareHandler<{ Bindings: Env }> = async (c, next) => {
  const origin = c.req.header("origin");
  if (origin === undefined) return next();
  const cfg = edgeConfig(c.env, (p) => c.executionCtx.waitUntil(p));
  const { settings } = cfg instanceof Promise ? await cfg : cfg;
  const allow = allowedOrigin(origin, settings.cors.allowed_origins);
  if (allow === undefined) return next();
  if (c.req.method === "OPTIONS" && c.req.header("access-control-request-method") !== undefined) {
    return new Response(null, {
      status: 204,
      headers: preflightHeaders(allow, c.req.header("access-control-request-headers")),
    });
  }
  await next();
  // Every /v1 answer is one the edge built (never an engine's response passed on), so its headers can change.
  for (const [k, v] of Object.entries(responseHeaders(allow))) c.res.headers.set(k, v);
};
