/**
 * How the edge reaches an engine, behind one fetch seam so the proxy does
 * not care:
 * - direct: the endpoint URL over the public internet (or loopback locally);
 * - vpc: a Workers VPC network binding to a Cloudflare Tunnel, where the URL
 *   (private IP or hostname) picks the destination and nothing is public;
 * - tunnel: a public tunnel hostname behind Cloudflare Access, reached with
 *   the service token the Worker holds as secrets.
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

export function upstreamFor(
  endpoint: Pick<EndpointRecord, "id" | "via">,
  env: UpstreamEnv,
  direct: UpstreamFetch = (url, init) => fetch(url, init),
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
