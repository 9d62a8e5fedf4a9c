/**
 * One streamed chat completion as the load generator reads it: the request
 * it sends, and the answer timed event by event (first token, the gaps
 * between tokens) into a RequestResult. A failure is a result too: a
 * refusal, an error event mid-stream, a cut stream, a timeout.
 */
import type { IncomingMessage } from "node:http";
import { eventFields, SseSplitter } from "../common/sse.ts";
import type { RequestResult } from "./stats.ts";
import type { WorkloadRequest } from "./workloads.ts";

/** The most of an error body read. */
export const MAX_ERROR_BODY = 64 * 1024;

interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
}

interface StreamChunk {
  error?: ErrorBody["error"];
  usage?: Usage | null;
  choices?: {
    delta?: { content?: string | null; reasoning_content?: string | null };
    text?: string;
    finish_reason?: string | null;
  }[];
}

interface ErrorBody {
  error?: { message?: string; type?: string; code?: string | number | null } | string;
  message?: string;
  type?: string;
  code?: string | number | null;
}

/** OpenAI's `{"error":{...}}`, vLLM's older flat `{"object":"error",...}`, or text. */
export function describeError(text: string): { code?: string; message: string } {
  try {
    const body = JSON.parse(text) as ErrorBody;
    const inner = typeof body.error === "object" && body.error !== null ? body.error : body;
    const message =
      typeof body.error === "string" ? body.error : (inner.message ?? text.slice(0, 300)).toString();
    // vLLM puts the HTTP status in `code`; its `type` says more then.
    const code = typeof inner.code === "string" && inner.code !== "" ? inner.code : inner.type;
    return { ...(code ? { code } : {}), message };
  } catch {
    return { message: text.trim().slice(0, 300) || "(empty body)" };
  }
}

/** The request's body and headers: streamed, with usage, its session and band as the edge's headers. */
export function chatRequest(
  model: string,
  r: WorkloadRequest,
): { body: string; headers: Record<string, string | number> } {
  const body = JSON.stringify({
    model,
    messages: r.messages,
    max_tokens: r.maxTokens,
    stream: true,
    stream_options: { include_usage: true },
    ...(r.ignoreEos ? { ignore_eos: true } : {}),
  });
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    accept: "text/event-stream",
    "content-length": Buffer.byteLength(body),
    ...(r.session !== undefined ? { "x-session-id": r.session } : {}),
    ...(r.band !== undefined ? { "x-llmgw-band": r.band } : {}),
  };
  return { body, headers };
}

interface Failure {
  status: number;
  error: string;
  message: string;
}

/** One answer being read; `settle` resolves it once, whichever end comes first. */
export class ChatStream {
  private readonly t0 = performance.now();
  private response: IncomingMessage | undefined;
  private recorded: Record<string, string> | undefined;
  private first = -1;
  private last = -1;
  private chunks = 0;
  private readonly gaps: number[] = [];
  private usage: Usage | undefined;
  private finished = false;
  private done = false;
  private settled = false;
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly r: WorkloadRequest,
    /** The target's clock (Target.timeScale) and the response headers to keep (Target.record). */
    private readonly target: { timeScale: number; record: readonly string[] },
    private readonly resolve: (result: RequestResult) => void,
  ) {}

  /** Milliseconds of real time as seconds of the target's. */
  private seconds(ms: number): number {
    return (ms / 1000) * this.target.timeScale;
  }

  /** A `timeout` result after `ms` without a complete answer; `cancel` stops the request. */
  abandonAfter(ms: number, cancel: () => void): void {
    this.timer = setTimeout(() => {
      this.settle({
        status: this.response?.statusCode ?? 0,
        error: "timeout",
        message: `no complete answer within ${ms} ms`,
      });
      cancel();
    }, ms);
  }

  /** The request failed: before an answer, a network error; after, a cut stream. */
  requestFailed(err: NodeJS.ErrnoException): void {
    this.settle(
      this.response
        ? {
            status: this.response.statusCode ?? 0,
            error: "stream cut",
            message: `stream interrupted: ${err.message}`,
          }
        : { status: 0, error: err.code ?? "network error", message: err.message },
    );
  }

  settle(fail?: Failure): void {
    if (this.settled) return;
    this.settled = true;
    clearTimeout(this.timer);
    const { r, usage, first, t0 } = this;
    const itl = new Float64Array(this.gaps.length);
    for (let i = 0; i < this.gaps.length; i++) itl[i] = this.seconds(this.gaps[i]!);
    const cached = usage?.prompt_tokens_details?.cached_tokens;
    this.resolve({
      ok: fail === undefined,
      status: fail?.status ?? this.response?.statusCode ?? 0,
      ...(fail ? { error: fail.error, errorMessage: fail.message } : {}),
      ...(first >= 0 ? { ttft: this.seconds(first - t0) } : {}),
      e2e: this.seconds(performance.now() - t0),
      itl,
      outputTokens: typeof usage?.completion_tokens === "number" ? usage.completion_tokens : this.chunks,
      ...(typeof usage?.prompt_tokens === "number" ? { promptTokens: usage.prompt_tokens } : {}),
      ...(typeof cached === "number" ? { cachedTokens: cached } : {}),
      ...(this.recorded ? { headers: this.recorded } : {}),
      ...(r.band !== undefined ? { band: r.band } : {}),
    });
  }

  /** The answer: a refusal's error body, or the stream read event by event to its end. */
  read(res: IncomingMessage): void {
    this.response = res;
    const recorded: Record<string, string> = {};
    this.recorded = recorded;
    for (const name of this.target.record) {
      const v = res.headers[name];
      if (v !== undefined) recorded[name] = Array.isArray(v) ? v.join(",") : v;
    }
    const status = res.statusCode ?? 0;
    res.setEncoding("utf8");
    if (status !== 200) {
      readText(res, MAX_ERROR_BODY).then(
        (text) => {
          const e = describeError(text);
          this.settle({
            status,
            error: `${status}${e.code ? ` ${e.code}` : ""}`,
            message: `${status}: ${e.message}`,
          });
        },
        (err: Error) => this.settle({ status, error: `${status}`, message: `${status}: ${err.message}` }),
      );
      return;
    }
    const type = String(res.headers["content-type"] ?? "");
    if (!type.includes("text/event-stream")) {
      res.resume();
      this.settle({ status, error: "not a stream", message: `expected text/event-stream, got "${type}"` });
      return;
    }
    const splitter = new SseSplitter();
    res.on("data", (part: string) => {
      const now = performance.now();
      for (const event of splitter.push(part)) {
        if (this.settled) break;
        this.onEvent(res, status, event, now);
      }
    });
    res.on("end", () => {
      for (const event of splitter.end())
        if (!this.settled) this.onEvent(res, status, event, performance.now());
      if (this.done || this.finished) this.settle();
      else
        this.settle({
          status,
          error: "stream cut",
          message: "the stream ended without a finish_reason or [DONE]",
        });
    });
    res.on("error", (err: Error) =>
      this.settle({ status, error: "stream cut", message: `stream interrupted: ${err.message}` }),
    );
  }

  /** One SSE event: [DONE], an error (which ends the read), or a chunk whose tokens are timed at `now`. */
  private onEvent(res: IncomingMessage, status: number, event: string, now: number): void {
    const fields = eventFields(event);
    const data = fields.data ?? "";
    const errorEvent = fields.event === "error";
    if (data === "") return;
    if (data === "[DONE]") {
      this.done = true;
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(data);
    } catch {}
    // Checked by hand rather than with zod: this runs for every chunk of
    // every stream, and the bench's own CPU must not limit what it measures.
    if (!isChunk(parsed)) {
      this.settle({ status, error: "bad event", message: `not a stream chunk: ${data.slice(0, 200)}` });
      res.destroy();
      return;
    }
    const chunk = parsed;
    if (chunk.error !== undefined || errorEvent) {
      const e = describeError(data);
      this.settle({
        status,
        error: `stream ${e.code ?? "error"}`,
        message: `error event mid-stream: ${e.message}`,
      });
      res.destroy();
      return;
    }
    if (isObject(chunk.usage)) this.usage = chunk.usage;
    for (const c of chunk.choices ?? []) {
      const text = c.delta?.content || c.delta?.reasoning_content || c.text;
      if (text) {
        this.chunks++;
        if (this.first < 0) this.first = now;
        else this.gaps.push(now - this.last);
        this.last = now;
      }
      if (c.finish_reason) this.finished = true;
    }
  }
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null;

/** An object whose choices, if any, are an array of objects with an object delta, if any. */
function isChunk(v: unknown): v is StreamChunk {
  if (!isObject(v) || Array.isArray(v)) return false;
  if (v.choices === undefined || v.choices === null) return true;
  return (
    Array.isArray(v.choices) &&
    v.choices.every((c) => isObject(c) && (c.delta === undefined || c.delta === null || isObject(c.delta)))
  );
}

/** The body as text, at most `limit` characters of it kept. */
export function readText(res: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = "";
    res.setEncoding("utf8");
    res.on("data", (s: string) => {
      if (text.length < limit) text += s;
    });
    res.on("end", () => resolve(text.slice(0, limit)));
    res.on("error", reject);
  });
}
