/**
 * Which engine the sim engine plays. The engine underneath (scheduler, KV
 * cache, latency model, generation) is one; a persona is what a client sees
 * differently: its routes besides inference, its error bodies, its ids,
 * what it does with `model`, its stream options and its wire (wire.ts).
 * SimServer plays vLLM when it is given none; sglang-persona.ts is SGLang.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { UsageMode } from "../common/usage-mode.ts";
import type { GenerationSpec, RequestObserver } from "./generation.ts";
import type { ApiError } from "./protocol.ts";
import type { Wire } from "./wire.ts";

export interface StreamOptionsLike {
  include_usage?: boolean | null | undefined;
  continuous_usage_stats?: boolean | null | undefined;
}

export interface Persona {
  /**
   * Answers every request but inference (a POST to /v1/chat/completions,
   * /v1/completions, /v1/embeddings or /v1/responses), and returns true;
   * returns false to let SimServer serve it.
   */
  route(req: IncomingMessage, res: ServerResponse, path: string, method: string): boolean | Promise<boolean>;
  readonly wire: Wire;
  /** The `model` a response names, from what the request asked. */
  model(requested: string | null | undefined): string;
  newId(kind: GenerationSpec["kind"]): string;
  /** A whole error response's body. */
  errorBody(e: ApiError): string;
  /** What a stream that has sent its headers ends with when it fails. */
  streamErrorTail(e: ApiError): string;
  /** A request's output limit, or the 400 for a prompt (plus `asked`) the context cannot hold. */
  outputLimit(kind: GenerationSpec["kind"], prompt: number, asked: number | undefined): number;
  /** What a request that names no output limit gets (SGLang's completions: 16). */
  defaultMaxTokens(kind: GenerationSpec["kind"]): number | undefined;
  /** The usage a stream carries, from its `stream_options`: token chunks' mode and whether a usage chunk ends it. */
  usage(opts: StreamOptionsLike | null | undefined): { mode: UsageMode; final: boolean };
  /** An embeddings answer, its vectors already rendered. */
  embeddingsBody(model: string, vectors: readonly string[], promptTokens: number): string;
  readonly eosTokenId?: number;
  readonly observer?: RequestObserver;
}
