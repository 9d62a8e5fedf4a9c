/**
 * The edge's access log: one line of JSON per inference request, written
 * with console.log once the request is over (its last byte relayed, or its
 * refusal sent), so Workers Logs, Logpush and `wrangler tail` carry it as
 * it is. It names the key by id, never by its secret; the fields are in
 * docs/edge.md#access-log.
 */
import type { Usage } from "./proxy/sse-usage.ts";

export interface AccessEntry {
  request_id: string;
  path: string;
  /** The key's id; null when the caller was refused before it was known. */
  key_id: string | null;
  /** The model as asked for; null when the body was refused before it was read. */
  model: string | null;
  /** The model that answered (a fallback's name when one did). */
  model_served: string | null;
  band: string | null;
  stream: boolean;
  endpoint: string | null;
  /** Which tier picked the endpoint: session, prefix, load, … or fail-open. */
  route: string | null;
  /** How the request was admitted: pool, grant or fail-open. */
  admitted: string | null;
  attempts: number;
  status: number;
  /** The OpenAI error code of a refusal or failure (queue_full, invalid_api_key, …). */
  error_code: string | null;
  /** From arrival to the first byte of the answer: the first token of a stream, the whole body otherwise. */
  ttft_ms: number | null;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  /** The token counts are the edge's estimate: the engine reported no usage (docs/engines.md). */
  usage_estimated: boolean;
  /** From arrival to the end: the last byte relayed, or the refusal. */
  duration_ms: number;
  /** The engine finished the answer. */
  completed: boolean;
  /** The client went away first. */
  client_disconnected: boolean;
}

export const ACCESS_LOG_TYPE = "llmgw.access";

/** Collects what each step learns of one request, and writes its line once. */
export class AccessLog {
  readonly entry: AccessEntry;
  private written = false;

  constructor(
    requestId: string,
    path: string,
    private readonly arrived: number,
    private readonly write: (line: string) => void = (line) => console.log(line),
  ) {
    this.entry = {
      request_id: requestId,
      path,
      key_id: null,
      model: null,
      model_served: null,
      band: null,
      stream: false,
      endpoint: null,
      route: null,
      admitted: null,
      attempts: 0,
      status: 0,
      error_code: null,
      ttft_ms: null,
      prompt_tokens: null,
      completion_tokens: null,
      usage_estimated: false,
      duration_ms: 0,
      completed: false,
      client_disconnected: false,
    };
  }

  set(fields: Partial<AccessEntry>): void {
    Object.assign(this.entry, fields);
  }

  firstByte(at: number): void {
    this.entry.ttft_ms = Math.max(0, at - this.arrived);
  }

  usage(u: Usage | undefined, estimated = false): void {
    if (!u) return;
    this.entry.prompt_tokens = u.prompt_tokens;
    this.entry.completion_tokens = u.completion_tokens;
    this.entry.usage_estimated = estimated;
  }

  /** Writes the line; later calls do nothing, so every path may end with it. */
  end(at: number): void {
    if (this.written) return;
    this.written = true;
    this.entry.duration_ms = Math.max(0, at - this.arrived);
    this.write(JSON.stringify({ type: ACCESS_LOG_TYPE, ...this.entry }));
  }
}
