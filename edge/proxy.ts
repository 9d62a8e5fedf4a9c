import { usageModeOf } from "../common/usage-mode.ts";
import type { Target } from "./attempt-plan.ts";
import {
  ApiError,
  errors,
  normaliseEngineError,
  type OpenAIErrorBody,
  sseErrorEvent,
} from "./openai-errors.ts";
import type { RouterConfig } from "./router-config.ts";
import type { Verdict } from "./routing/pool-core.ts";
import type { EndpointSpec } from "./routing/types.ts";
import { readUsage, SseSplitter, StreamUsage, type Usage } from "./sse-usage.ts";
import { headerWait, PhaseTimeout, tighter, Watchdog, withTimeout } from "./timeouts.ts";
import { engineUrl, type UpstreamFetch } from "./upstream.ts";

/**
 * Sends one OpenAI request to an engine and streams the answer back.
 *
 * Attempts: the endpoints come from the plan (the pool's lease: its choice
 * and ranked alternates, then the fallback models' pools), each tried at
 * most once. A failed attempt is retried only while nothing has been sent
 * to the client: for a stream the client's response starts with the first
 * data event, so a dead, erroring or silent engine before the first token
 * is still retried (or answered with a proper status); after it, failures
 * become an SSE error event and a clean close. Every attempt's verdict goes
 * to its lease — the proxy never touches breakers or counts itself.
 */
export type ApiPath = "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings";

export interface Targets {
  take(): Promise<Target | undefined>;
}

export interface ProxyInput {
  requestId: string;
  apiPath: ApiPath;
  body: Record<string, unknown>;
  stream: boolean;
  settings: RouterConfig;
  band: string;
  targets: Targets;
  /** Fires when the client goes away (enable_request_signal). */
  clientSignal?: AbortSignal | undefined;
  upstream: (e: EndpointSpec) => UpstreamFetch;
  /** The stream the client reads; workerd's native IdentityTransformStream unless a test hosts the proxy elsewhere. */
  pipe?: () => ReadableWritablePair<Uint8Array, Uint8Array>;
  now?: () => number;
}

export interface Outcome {
  status: number;
  usage: Usage | undefined;
  endpointId: string | undefined;
  model: string | undefined;
  attempts: number;
  /** The engine finished the answer (stream saw [DONE] / body complete). */
  completed: boolean;
  /** The client went away before the answer ended. */
  disconnected: boolean;
  /** The error code of a failure the edge answered with (no_capacity, first_token_timeout, …). */
  errorCode?: string | null;
}

export interface ProxyResult {
  response: Response;
  /** Resolves when the last byte has been relayed (or the stream was cut off). */
  outcome: Promise<Outcome>;
}

type Attempt =
  | { kind: "committed"; response: Response; outcome: Promise<Outcome & { verdict: Verdict }> }
  | { kind: "failed"; error: ApiError; retryable: boolean; verdict: Verdict };

const RETRYABLE_STATUS = new Set([408, 429, 500, 502, 503, 504]);
const MAX_ERROR_BODY = 64 * 1024;
const MAX_RESPONSE_BODY = 32 * 1024 * 1024;
const STREAM_BUFFER_BYTES = 4 * 1024 * 1024;
const encoder = new TextEncoder();

function nativePipe(): ReadableWritablePair<Uint8Array, Uint8Array> {
  // A native byte stream (no JS on the runtime's side of each chunk), with
  // room for a few MiB so writes never wait for a slow client: the engine
  // side is read as fast as it arrives.
  return new IdentityTransformStream({ highWaterMark: STREAM_BUFFER_BYTES });
}

export async function proxy(input: ProxyInput): Promise<ProxyResult> {
  const now = input.now ?? Date.now;
  const started = now();
  let attempts = 0;
  let last: ApiError | undefined;
  const baseHeaders = { "x-request-id": input.requestId, "x-llmgw-band": input.band };

  for (let t = await input.targets.take(); t; t = await input.targets.take()) {
    attempts++;
    const { lease } = t;
    const headers = {
      ...baseHeaders,
      "x-llmgw-endpoint": t.endpoint.id,
      "x-llmgw-attempts": String(attempts),
      "x-llmgw-route": lease.failOpen ? "fail-open" : lease.lease.route,
      "x-llmgw-queued-ms": String(Math.round(lease.lease.queuedMs)),
    };
    const r = await attempt(input, t.endpoint, t.model, started, headers, attempts);
    if (r.kind === "committed") {
      const outcome = r.outcome.then((o) => {
        lease.record(t.endpoint.id, o.verdict);
        return o;
      });
      return { response: r.response, outcome };
    }
    lease.record(t.endpoint.id, r.verdict);
    last = r.error;
    if (!r.retryable) return failure(r.error, headers, attempts);
  }
  last ??= errors.noCapacity(
    `No endpoint for model ${String(input.body.model)} could be tried.`,
    "no_capacity",
  );
  return failure(last, { ...baseHeaders, "x-llmgw-attempts": String(attempts) }, attempts);

  function failure(err: ApiError, headers: Record<string, string>, n: number): ProxyResult {
    return {
      response: err.toResponse(headers),
      outcome: Promise.resolve({
        status: err.status,
        usage: undefined,
        endpointId: headers["x-llmgw-endpoint"],
        model: undefined,
        attempts: n,
        completed: false,
        disconnected: false,
        errorCode: err.code,
      }),
    };
  }
}

function upstreamBody(input: ProxyInput, model: string): string {
  const body: Record<string, unknown> = { ...input.body, model };
  if (input.stream && input.settings.inject_usage && input.apiPath !== "/v1/embeddings") {
    const asked = (input.body.stream_options ?? {}) as Record<string, unknown>;
    body.stream_options = { ...asked, include_usage: true, continuous_usage_stats: true };
  }
  return JSON.stringify(body);
}

function describe(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

function timeoutError(t: PhaseTimeout, ep: EndpointSpec): ApiError {
  if (t.phase === "first_token") {
    return errors.timeout(
      `The engine (${ep.id}) sent no token within ${t.ms} ms (first_token timeout).`,
      "first_token_timeout",
    );
  }
  return errors.timeout(
    `The engine (${ep.id}) timed out (${t.phase} after ${t.ms} ms).`,
    `${t.phase}_timeout`,
  );
}

async function readLimited(
  res: Response,
  limit: number,
  idleMs: number,
  totalDeadline: number,
  abort: () => void,
): Promise<string> {
  if (!res.body) return "";
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let size = 0;
  for (;;) {
    const [ms, phase] = tighter("idle", idleMs, totalDeadline, Date.now());
    const { done, value } = await withTimeout(reader.read(), ms, phase, abort);
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      abort();
      throw new Error(`engine response larger than ${limit} bytes`);
    }
    text += decoder.decode(value, { stream: true });
  }
  return text + decoder.decode();
}

async function attempt(
  input: ProxyInput,
  ep: EndpointSpec,
  model: string,
  started: number,
  headers: Record<string, string>,
  attempts: number,
): Promise<Attempt> {
  const t = input.settings.timeouts;
  const totalDeadline = started + t.total;
  const ctrl = new AbortController();
  const abort = () => ctrl.abort();
  const fetchUp = input.upstream(ep);
  // A stream's phases (header wait, first token, idle between chunks) share
  // one timer; a non-streamed answer is bounded by `total` alone.
  const watchdog = input.stream
    ? new Watchdog(totalDeadline, abort, Date.now, Math.min(t.response_header, t.first_token, t.idle))
    : undefined;
  // An engine's own 4xx is a live engine refusing the caller: a success for its breaker.
  const fail = (error: ApiError, retryable: boolean, engineFault: boolean): Attempt => {
    watchdog?.stop();
    abort();
    return {
      kind: "failed",
      verdict: engineFault ? "fail" : "ok",
      error: new ApiError(error.status, error.message, error.type, error.code, error.param, {
        ...error.headers,
        ...headers,
      }),
      retryable,
    };
  };

  const attemptStart = Date.now();
  let res: Response;
  try {
    // Non-streamed answers come back whole, headers and all, so the header
    // wait of a non-streamed request is the generation itself: bounded by
    // `total` only. Streams get headers as soon as the engine accepts, and
    // their first token is due within `first_token` of now in any case.
    watchdog?.arm(...headerWait(t.response_header, t.first_token));
    const sent = fetchUp(engineUrl(ep.url, input.apiPath), {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: input.stream ? "text/event-stream" : "application/json",
        "x-request-id": input.requestId,
      },
      body: upstreamBody(input, model),
      signal: ctrl.signal,
    });
    res = await (watchdog
      ? sent
      : withTimeout(sent, ...tighter("total", t.total, totalDeadline, attemptStart), abort));
  } catch (err) {
    if (watchdog?.fired) return fail(timeoutError(watchdog.fired, ep), true, true);
    if (err instanceof PhaseTimeout) return fail(timeoutError(err, ep), true, true);
    return fail(
      errors.noCapacity(`Could not reach the engine (${ep.id}): ${describe(err)}`, "upstream_unreachable"),
      true,
      true,
    );
  }

  if (res.status >= 400) {
    let text = "";
    try {
      text = await readLimited(res, MAX_ERROR_BODY, t.idle, totalDeadline, abort);
    } catch {
      // The status is what matters; a truncated body just gets a generic message.
    }
    const body = normaliseEngineError(res.status, text);
    const err = new ApiError(res.status, body.message, body.type, body.code, body.param);
    return fail(err, RETRYABLE_STATUS.has(res.status), res.status >= 500);
  }

  if (!input.stream) {
    let text: string;
    try {
      text = await readLimited(res, MAX_RESPONSE_BODY, t.idle, totalDeadline, abort);
    } catch (err) {
      if (err instanceof PhaseTimeout) return fail(timeoutError(err, ep), true, true);
      return fail(
        errors.noCapacity(`The engine (${ep.id}) failed while answering: ${describe(err)}`, "upstream_error"),
        true,
        true,
      );
    }
    let usage: Usage | undefined;
    try {
      usage = readUsage((JSON.parse(text) as Record<string, unknown>).usage);
    } catch {
      usage = undefined;
    }
    return {
      kind: "committed",
      response: new Response(text, {
        status: res.status,
        headers: { "content-type": res.headers.get("content-type") ?? "application/json", ...headers },
      }),
      outcome: Promise.resolve({
        status: res.status,
        usage,
        endpointId: ep.id,
        model,
        attempts,
        completed: true,
        disconnected: false,
        verdict: "ok",
      }),
    };
  }

  // Streaming: hold the client's response until the first data event.
  if (!watchdog) throw new Error("a streamed attempt always has a watchdog");
  if (!res.body)
    return fail(errors.noCapacity(`The engine (${ep.id}) sent no body.`, "upstream_error"), true, true);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const splitter = new SseSplitter();
  const tracker = new StreamUsage(usageModeOf(input.body.stream_options as never));
  watchdog.arm("first_token", t.first_token - (Date.now() - attemptStart));
  let head = "";
  try {
    while (tracker.dataEvents === 0 && !tracker.done && !tracker.error) {
      const r = await reader.read();
      if (r.done) break;
      for (const ev of splitter.push(decoder.decode(r.value, { stream: true }))) head += tracker.event(ev);
    }
  } catch (err) {
    if (watchdog.fired) {
      const e =
        watchdog.fired.phase === "first_token"
          ? new PhaseTimeout("first_token", t.first_token)
          : watchdog.fired;
      return fail(timeoutError(e, ep), true, true);
    }
    return fail(
      errors.noCapacity(
        `The engine (${ep.id}) failed before the first token: ${describe(err)}`,
        "upstream_error",
      ),
      true,
      true,
    );
  }
  if (tracker.error && tracker.dataEvents === 0) {
    const e = tracker.error;
    return fail(new ApiError(500, e.message, e.type, e.code, e.param), true, true);
  }
  if (tracker.dataEvents === 0 && !tracker.done) {
    return fail(
      errors.noCapacity(`The engine (${ep.id}) closed the stream before the first token.`, "upstream_error"),
      true,
      true,
    );
  }
  watchdog.arm("idle", t.idle);

  // Committed: from here on the client has bytes, so no more retries.
  let cancelled = false;
  let finish!: (o: Outcome & { verdict: Verdict }) => void;
  const outcome = new Promise<Outcome & { verdict: Verdict }>((r) => {
    finish = r;
  });
  const onClientGone = () => {
    if (cancelled) return;
    cancelled = true;
    abort();
  };
  input.clientSignal?.addEventListener("abort", onClientGone, { once: true });
  const pipe = (input.pipe ?? nativePipe)();
  const writer = pipe.writable.getWriter();
  writer.closed.catch(onClientGone);
  let lastWrite: Promise<void> = Promise.resolve();
  const write = (bytes: Uint8Array) => {
    if (cancelled || bytes.byteLength === 0) return;
    lastWrite = writer.write(bytes);
    lastWrite.catch(onClientGone);
  };
  const send = (text: string) => {
    if (text) write(encoder.encode(text));
  };
  if (head) send(head);
  const endWith = (err: OpenAIErrorBody | undefined) => {
    if (cancelled) return;
    if (err) send(sseErrorEvent(err));
    writer.close().catch(() => {});
  };

  // Read eagerly rather than when the client pulls: every chunk the engine
  // sends is parsed for usage at once, so on a disconnect the last usage
  // seen is as close as possible to what the engine generated.
  const pump = async (): Promise<Outcome & { verdict: Verdict }> => {
    let verdict: Verdict = "ok";
    try {
      while (!tracker.done && !tracker.error) {
        const r = await reader.read();
        if (r.done) break;
        watchdog.touch();
        // Most chunks are one whole event and never become text (see
        // StreamUsage.chunk); the rest go through the splitter.
        const fast = splitter.idle ? tracker.chunk(r.value) : undefined;
        if (fast !== undefined) write(fast);
        else {
          let out = "";
          for (const ev of splitter.push(decoder.decode(r.value, { stream: true }))) out += tracker.event(ev);
          send(out);
        }
        // Past the buffer the client really is slow: wait for it.
        if ((writer.desiredSize ?? 1) <= 0) await lastWrite.catch(() => {});
      }
      if (cancelled) verdict = "abandon";
      else if (tracker.error) {
        verdict = "fail";
        endWith(undefined);
      } else if (!tracker.done) {
        verdict = "fail";
        endWith({
          message: `The engine (${ep.id}) closed the stream before finishing the answer.`,
          type: "server_error",
          param: null,
          code: "upstream_disconnected",
        });
      } else endWith(undefined);
    } catch (err) {
      abort();
      if (cancelled) verdict = "abandon";
      else {
        verdict = "fail";
        const e = watchdog.fired
          ? timeoutError(watchdog.fired, ep).body()
          : {
              message: `The engine (${ep.id}) failed mid-stream: ${describe(err)}`,
              type: "server_error",
              param: null,
              code: "upstream_disconnected",
            };
        endWith(e);
      }
    } finally {
      watchdog.stop();
      input.clientSignal?.removeEventListener("abort", onClientGone);
    }
    return {
      status: 200,
      usage: tracker.usage,
      endpointId: ep.id,
      model,
      attempts,
      completed: tracker.done,
      disconnected: cancelled,
      verdict,
    };
  };
  pump().then(finish, () =>
    finish({
      status: 200,
      usage: tracker.usage,
      endpointId: ep.id,
      model,
      attempts,
      completed: false,
      disconnected: cancelled,
      verdict: cancelled ? "abandon" : "fail",
    }),
  );

  return {
    kind: "committed",
    response: new Response(pipe.readable, {
      status: 200,
      headers: {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        // Cloudflare does not compress event streams by default; say so
        // explicitly so nothing in between buffers for a compressor.
        "content-encoding": "identity",
        ...headers,
      },
    }),
    outcome,
  };
}
