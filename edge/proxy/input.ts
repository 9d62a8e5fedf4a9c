/**
 * What the proxy is asked to do for one request: the request as the edge
 * validated it, the endpoints it may try and the settings it runs under.
 */

import type { RouterConfig } from "../config/router.ts";
import type { EndpointSpec } from "../routing/types.ts";
import type { Target } from "./attempt-plan.ts";
import type { UpstreamFetch } from "./upstream.ts";

export type ApiPath = "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/v1/embeddings";

export interface Targets {
  take(): Promise<Target | undefined>;
}

export interface ProxyInput {
  requestId: string;
  apiPath: ApiPath;
  body: Record<string, unknown>;
  /** The prompt as admission estimated it: what a charge is made of when the engine reported no usage. */
  promptTokens: number;
  stream: boolean;
  settings: RouterConfig;
  band: string;
  targets: Targets;
  /** Fires when the client goes away (enable_request_signal). */
  clientSignal?: AbortSignal | undefined;
  upstream: (e: EndpointSpec) => UpstreamFetch;
  /** The stream the client reads; workerd's native IdentityTransformStream unless a test hosts the proxy elsewhere. */
  pipe?: () => ReadableWritablePair<Uint8Array, Uint8Array>;
}

/**
 * How many choices a streamed answer has, each of which must finish for it
 * to be complete: `n` per prompt, and a completions request may send a
 * list of prompts (texts, or token lists), each answered `n` times.
 */
export function choicesAsked(body: Readonly<Record<string, unknown>>, apiPath: ApiPath): number {
  const n = typeof body.n === "number" && body.n >= 1 ? Math.floor(body.n) : 1;
  const prompt = body.prompt;
  const prompts =
    apiPath === "/v1/completions" &&
    Array.isArray(prompt) &&
    prompt.length > 0 &&
    typeof prompt[0] !== "number"
      ? prompt.length
      : 1;
  return n * prompts;
}
