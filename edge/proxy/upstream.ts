/**
 * How the edge reaches an engine, behind one fetch seam so the proxy does
 * not care:
 * - direct: the endpoint URL over the public internet (or loopback locally);
 * - vpc: a Workers VPC network binding to a Cloudflare Tunnel, where the URL
 *   (private IP or hostname) picks the destination and nothing is public;
 * - tunnel: a public tunnel hostname behind Cloudflare Access, reached with
 *   the service token the Worker holds as secrets.
 *
 * Whichever way, an engine that requires a key (`--api-key`) is sent it as
 * `Authorization: Bearer KEY`: the endpoint set carries it, the routing
 * table holds it by endpoint id (RoutingTable.engineKeyOf), and the caller
 * passes it in here. The client's own Authorization never reaches an engine.
 */
import type { EndpointRecord } from "../config/catalog.ts";

export interface FetchLike {
  fetch(input: string | Request, init?: RequestInit): Promise<Response>;
}

export type UpstreamFetch = (url: string, init: RequestInit) => Promise<Response>;

export interface UpstreamEnv {
  LLMGW_VPC_BINDING?: string;
  CF_ACCESS_CLIENT_ID?: string;
  CF_ACCESS_CLIENT_SECRET?: string;
}

export class UpstreamConfigError extends Error {}

const globalFetch: UpstreamFetch = (url, init) => fetch(url, init);

/**
 * `init` with the engine's key as its Authorization header, in place of
 * any other. The proxy's own headers are a plain object, copied as one;
 * anything else goes through Headers.
 */
function withBearer(init: RequestInit, bearer: string): RequestInit {
  const h = init.headers;
  if (h instanceof Headers || Array.isArray(h)) {
    const headers = new Headers(h);
    headers.set("authorization", bearer);
    return { ...init, headers };
  }
  const own = h as Record<string, string> | undefined;
  const headers: Record<string, string> = { authorization: bearer };
  for (const k in own) if (k.toLowerCase() !== "authorization") headers[k] = own[k]!;
  return { ...init, headers };
}

/**
 * How one attempt reaches `endpoint`. `apiKey`: the key its engine
 * requires, if any. Without one nothing is added per request: the fetch
 * for `direct` is the plain one.
 */
export function upstreamFor(
  endpoint: Pick<EndpointRecord, "id" | "via">,
  env: UpstreamEnv,
  apiKey?: string | undefined,
  direct: UpstreamFetch = globalFetch,
): UpstreamFetch {
  const base = reach(endpoint, env, direct);
  if (!apiKey) return base;
  const bearer = `Bearer ${apiKey}`;
  return (url, init) => base(url, withBearer(init, bearer));
}

function reach(
  endpoint: Pick<EndpointRecord, "id" | "via">,
  env: UpstreamEnv,
  direct: UpstreamFetch,
): UpstreamFetch {
  switch (endpoint.via) {
    case "vpc": {
      const name = env.LLMGW_VPC_BINDING || "ONPREM";
      const binding = (env as Record<string, unknown>)[name] as FetchLike | undefined;
      if (!binding || typeof binding.fetch !== "function") {
        return () =>
          Promise.reject(
            new UpstreamConfigError(
              `endpoint ${endpoint.id} is via vpc but the Worker has no "${name}" VPC binding`,
            ),
          );
      }
      return (url, init) => binding.fetch(url, init);
    }
    case "tunnel": {
      const id = env.CF_ACCESS_CLIENT_ID;
      const secret = env.CF_ACCESS_CLIENT_SECRET;
      if (!id || !secret) {
        return () =>
          Promise.reject(
            new UpstreamConfigError(
              `endpoint ${endpoint.id} is via tunnel but CF_ACCESS_CLIENT_ID/CF_ACCESS_CLIENT_SECRET are not set`,
            ),
          );
      }
      return (url, init) => {
        const headers = new Headers(init.headers);
        headers.set("CF-Access-Client-Id", id);
        headers.set("CF-Access-Client-Secret", secret);
        return direct(url, { ...init, headers });
      };
    }
    default:
      return direct;
  }
}

/** The engine URL for an API path: the endpoint URL may or may not end in /v1. */
export function engineUrl(base: string, apiPath: string): string {
  const b = base.replace(/\/+$/, "");
  return b.endsWith("/v1") ? `${b}${apiPath.slice(3)}` : `${b}${apiPath}`;
}
