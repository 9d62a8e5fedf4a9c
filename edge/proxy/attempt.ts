/**
 * One attempt at one endpoint, as four steps: connect, then read the whole
 * answer (non-streamed) or read the stream up to its first token, then
 * relay it. Every step before `relay` may return a Failure, and the proxy
 * may then try another endpoint; `relay` cannot: the client has bytes of
 * the answer, so "no retry after the first token" is where the signatures
 * change. Whether the client's 200 went out before the first token (at the
 * engine's headers) is the proxy's choice; these steps read the same either
 * way. What each failure means is failure.ts's; this file only reads and
 * writes.
 */
import { SseSplitter } from "../../common/sse.ts";
import { usageModeOf } from "../../common/usage-mode.ts";
import { type OpenAIErrorBody, responsesErrorEvent, sseErrorEvent } from "../openai-errors.ts";
import type { EndpointSpec } from "../routing/types.ts";
import {
  type End,
  earlyEnd,
  type Failure,
  outcomeOf,
  statusFailure,
  thrownFailure,
  type Verdicted,
} from "./failure.ts";
import type { ApiPath } from "./input.ts";
import { choicesAsked, type ProxyInput } from "./input.ts";
import { ResponseEvents } from "./response-events.ts";
import { readUsage, type StreamTracker, StreamUsage } from "./sse-usage.ts";
import { headerWait, PhaseTimeout, tighter, Watchdog, withTimeout } from "./timeouts.ts";
import { engineUrl, UpstreamConfigError } from "./upstream.ts";
import { answerText, countedUsage } from "./usage-estimate.ts";

const MAX_ERROR_BODY = 64 * 1024;
const MAX_RESPONSE_BODY = 32 * 1024 * 1024;
const STREAM_BUFFER_BYTES = 4 * 1024 * 1024;
// What an engine may still send after `[DONE]` (its body's end, normally
// already in the buffer) before the connection is given up.
const TAIL_WAIT_MS = 250;
const TAIL_BYTES = 16 * 1024;
const encoder = new TextEncoder();

/** One attempt's fixed facts and its means to stop. */
export interface Call {
  input: ProxyInput;
  endpoint: EndpointSpec;
  /** The catalog's model this attempt serves (the engine may know it by another name: servedModelName). */
  model: string;
  /** This attempt's number within the request (1 for the first). */
  attempts: number;
  /** Headers the client's response carries (routing, attempts). */
  headers: Record<string, string>;
  totalDeadline: number;
  started: number;
  abort: () => void;
  signal: AbortSignal;
  /** A stream's one timer for its phases; a non-streamed answer is bounded by `total` alone. */
  watchdog: Watchdog | undefined;
}

/** The client's response, and the outcome once its last byte is out. */
export interface Committed {
  response: Response;
  outcome: Promise<Verdicted>;
}

/** A stream whose first token has come, not yet sent anywhere. */
export interface Held {
  reader: ReadableStreamDefaultReader<Uint8Array>;
  splitter: SseSplitter;
  tracker: StreamTracker;
  decoder: TextDecoder;
  /** What to send first: the events read so far. */
  head: string;
}

export function isFailure(v: unknown): v is Failure {
  return typeof v === "object" && v !== null && "retryable" in v && "verdict" in v;
}

export function newCall(
  input: ProxyInput,
  endpoint: EndpointSpec,
  model: string,
  attempts: number,
  headers: Record<string, string>,
  requestStarted: number,
): Call {
  const t = input.settings.timeouts;
  const ctrl = new AbortController();
  const abort = () => ctrl.abort();
  const totalDeadline = requestStarted + t.total;
  // A stream's phases (header wait, first token, idle between chunks) share one timer.
  const watchdog = input.stream
    ? new Watchdog(totalDeadline, abort, Date.now, Math.min(t.response_header, t.first_token, t.idle))
    : undefined;
  return {
    input,
    endpoint,
    model,
    attempts,
    headers,
    totalDeadline,
    started: Date.now(),
    abort,
    signal: ctrl.signal,
    watchdog,
  };
}

function trackerFor(input: ProxyInput): StreamTracker {
  if (input.apiPath === "/v1/responses") return new ResponseEvents();
  return new StreamUsage(usageModeOf(input.body.stream_options as never));
}

/** How a stream of this API tells its client of a failure after its headers went out. */
export function errorEventFor(apiPath: ApiPath, err: OpenAIErrorBody): string {
  return apiPath === "/v1/responses" ? responsesErrorEvent(err) : sseErrorEvent(err);
}

function where(call: Call) {
  return { endpoint: call.endpoint.id, model: call.model, attempts: call.attempts };
}

function upstreamBody(input: ProxyInput, model: string): string {
  const body: Record<string, unknown> = { ...input.body, model };
  // A Responses stream always ends with its usage: nothing to ask for.
  const asks = input.apiPath === "/v1/chat/completions" || input.apiPath === "/v1/completions";
  if (input.stream && input.settings.inject_usage && asks) {
    const asked = (input.body.stream_options ?? {}) as Record<string, unknown>;
    body.stream_options = { ...asked, include_usage: true, continuous_usage_stats: true };
  }
  return JSON.stringify(body);
}

/** Sends the request; an error status comes back as its Failure, its body read. */
export async function connect(call: Call): Promise<Response | Failure> {
  const { input, endpoint, watchdog } = call;
  const t = input.settings.timeouts;
  // Non-streamed answers come back whole, headers and all, so the header
  // wait of a non-streamed request is the generation itself: bounded by
  // `total` only. Streams get headers as soon as the engine accepts, and
  // their first token is due within `first_token` of now in any case.
  watchdog?.arm(...headerWait(t.response_header, t.first_token));
  const body = upstreamBody(input, endpoint.servedModelName ?? call.model);
  const send = async (): Promise<Response> => {
    const sent = input.upstream(endpoint)(engineUrl(endpoint.url, input.apiPath), {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: input.stream ? "text/event-stream" : "application/json",
        "x-request-id": input.requestId,
      },
      body,
      signal: call.signal,
    });
    return watchdog
      ? sent
      : withTimeout(sent, ...tighter("total", t.total, call.totalDeadline, Date.now()), call.abort);
  };
  let res: Response;
  const sentAt = Date.now();
  try {
    res = await send().catch((err: unknown) => {
      if (!mayReconnect(call, err, Date.now() - sentAt)) throw err;
      return send();
    });
  } catch (err) {
    return stop(call, thrownFailure(endpoint.id, "connect", err, watchdog?.fired));
  }
  if (res.status < 400) return res;
  let text = "";
  try {
    text = await readLimited(call, res, MAX_ERROR_BODY);
  } catch {
    // The status is what matters; a truncated body just gets a generic message.
  }
  return stop(call, statusFailure(endpoint.id, res.status, text));
}

/**
 * A send that failed within RECONNECT_WITHIN_MS, with neither a timer nor
 * the client behind it, is sent once more to the same engine before it
 * counts as a failure. Engines close idle keep-alive connections (vLLM's
 * uvicorn after 5 s), and one that closes as the next request goes out on
 * it loses that request with "Network connection lost" though the engine
 * is fine: the runtime then dials a fresh connection. That happens within
 * a round trip of the send; a connection lost later was carrying work (a
 * non-streamed answer's generation), which is not done twice on one
 * engine. An engine that is really down refuses the second send too, at
 * once, and that one is the failure its breaker hears.
 */
const RECONNECT_WITHIN_MS = 1_000;

function mayReconnect(call: Call, err: unknown, afterMs: number): boolean {
  return (
    afterMs <= RECONNECT_WITHIN_MS &&
    !call.signal.aborted &&
    !(err instanceof PhaseTimeout) &&
    !(err instanceof UpstreamConfigError) &&
    call.watchdog?.fired === undefined
  );
}

function stop(call: Call, f: Failure): Failure {
  call.watchdog?.stop();
  call.abort();
  return f;
}

async function readLimited(call: Call, res: Response, limit: number): Promise<string> {
  if (!res.body) return "";
  const t = call.input.settings.timeouts;
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let size = 0;
  for (;;) {
    const [ms, phase] = tighter("idle", t.idle, call.totalDeadline, Date.now());
    const { done, value } = await withTimeout(reader.read(), ms, phase, call.abort);
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      call.abort();
      throw new Error(`engine response larger than ${limit} bytes`);
    }
    text += decoder.decode(value, { stream: true });
  }
  return text + decoder.decode();
}

/** A non-streamed answer, read whole before the client gets any of it. */
export async function readWhole(call: Call, res: Response): Promise<Committed | Failure> {
  let text: string;
  try {
    text = await readLimited(call, res, MAX_RESPONSE_BODY);
  } catch (err) {
    return stop(call, thrownFailure(call.endpoint.id, "read", err, undefined));
  }
  // Anything but a JSON object is relayed as it came; the charge falls back
  // to the prompt's estimate.
  let answer: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === "object" && parsed !== null) answer = parsed as Record<string, unknown>;
  } catch {}
  const counted = countedUsage(readUsage(answer.usage), call.input.promptTokens, answerText(answer));
  return {
    response: new Response(text, {
      status: res.status,
      headers: {
        "content-type": res.headers.get("content-type") ?? "application/json",
        ...call.headers,
      },
    }),
    outcome: Promise.resolve(outcomeOf(where(call), { kind: "answered" }, counted)),
  };
}

/** Reads a stream until its first data event: up to then, the client has nothing and a failure may be retried. */
export async function holdFirstToken(call: Call, res: Response): Promise<Held | Failure> {
  const { input, endpoint } = call;
  const watchdog = call.watchdog!;
  if (!res.body) return stop(call, earlyEnd(endpoint.id, "first_token", false));
  const held: Held = {
    reader: res.body.getReader(),
    splitter: new SseSplitter(),
    tracker: trackerFor(input),
    decoder: new TextDecoder(),
    head: "",
  };
  const { tracker } = held;
  watchdog.arm("first_token", input.settings.timeouts.first_token - (Date.now() - call.started));
  try {
    while (tracker.dataEvents === 0 && !tracker.done && !tracker.error) {
      const r = await held.reader.read();
      const events = r.done
        ? held.splitter.end()
        : held.splitter.push(held.decoder.decode(r.value, { stream: true }));
      for (const ev of events) held.head += tracker.event(ev);
      if (r.done) break;
    }
  } catch (err) {
    return stop(call, thrownFailure(endpoint.id, "first_token", err, firstTokenBlame(call, watchdog.fired)));
  }
  if (tracker.dataEvents === 0) return stop(call, earlyEnd(endpoint.id, "first_token", false, tracker.error));
  return held;
}

/**
 * The watchdog's first_token phase was armed with what was left of it after
 * the headers came; the client is told the whole limit.
 */
function firstTokenBlame(call: Call, fired: PhaseTimeout | undefined): PhaseTimeout | undefined {
  if (fired?.phase !== "first_token") return fired;
  return new PhaseTimeout("first_token", call.input.settings.timeouts.first_token);
}

/**
 * Reads what follows `[DONE]`, the body's end, after the client has its
 * own: the runtime gives a connection back to its pool only once its
 * response was read to the end, and one left half-read means a new
 * connection (a TCP handshake, and the engine's accept) for the next request.
 */
async function readToEnd(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<void> {
  let bytes = 0;
  try {
    for (;;) {
      const r = await withTimeout(reader.read(), TAIL_WAIT_MS, "idle");
      if (r.done) return;
      bytes += r.value.byteLength;
      if (bytes > TAIL_BYTES) break;
    }
  } catch {
    // Given up on below.
  }
  reader.cancel().catch(() => {});
}

function nativePipe(): ReadableWritablePair<Uint8Array, Uint8Array> {
  // A native byte stream (no JS on the runtime's side of each chunk), with
  // room for a few MiB so writes never wait for a slow client: the engine
  // side is read as fast as it arrives.
  return new IdentityTransformStream({ highWaterMark: STREAM_BUFFER_BYTES });
}

/**
 * The client's end of a stream: writes that stop once it has gone. It
 * outlives an attempt: a stream committed at the engine's headers may be
 * read from another engine's attempt before its first token goes out.
 */
export class ClientSide {
  gone = false;
  private last: Promise<void> = Promise.resolve();
  private readonly writer: WritableStreamDefaultWriter<Uint8Array>;
  private readonly readable: ReadableStream<Uint8Array>;
  private onGone: () => void = () => {};
  private readonly signal: AbortSignal | undefined;
  private readonly onAbort = () => this.leave();

  constructor(input: ProxyInput) {
    const pair = (input.pipe ?? nativePipe)();
    this.readable = pair.readable;
    this.writer = pair.writable.getWriter();
    this.writer.closed.catch(() => this.leave());
    this.signal = input.clientSignal;
    this.signal?.addEventListener("abort", this.onAbort, { once: true });
    // Gone before now: the listener above never fires.
    if (this.signal?.aborted) this.leave();
  }

  /** What the client's going stops: the attempt being read now. */
  whenGone(stop: () => void): void {
    this.onGone = stop;
    if (this.gone) stop();
  }

  leave(): void {
    if (this.gone) return;
    this.gone = true;
    this.onGone();
  }

  write(bytes: Uint8Array): void {
    if (this.gone || bytes.byteLength === 0) return;
    this.last = this.writer.write(bytes);
    this.last.catch(() => this.leave());
  }

  send(text: string): void {
    if (text) this.write(encoder.encode(text));
  }

  /** Past the pipe's buffer the client really is slow: wait for it. */
  async drained(): Promise<void> {
    if ((this.writer.desiredSize ?? 1) <= 0) await this.last.catch(() => {});
  }

  close(last: string): void {
    this.send(last);
    this.signal?.removeEventListener("abort", this.onAbort);
    if (!this.gone) this.writer.close().catch(() => {});
  }

  /** The client's 200: what it reads is whatever is written here. */
  response(headers: Record<string, string>): Response {
    return new Response(this.readable, {
      status: 200,
      headers: {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        // Cloudflare does not compress event streams by default; say so
        // explicitly so nothing in between buffers for a compressor.
        "content-encoding": "identity",
        ...headers,
      },
    });
  }
}

/**
 * Sends the held stream on and relays the rest into the client's stream.
 * The stream is complete when every choice finished (or the engine said
 * `[DONE]`) and the body ended cleanly; the client then gets its final
 * usage chunk if it asked for one, and `[DONE]`. Anything else ends with
 * an error event (docs/edge.md). Resolves once the last byte is out.
 */
export function relay(call: Call, held: Held, client: ClientSide): Promise<Verdicted> {
  const { input, endpoint } = call;
  const watchdog = call.watchdog!;
  const { reader, splitter, tracker, decoder } = held;
  watchdog.arm("idle", input.settings.timeouts.idle);
  // The engine's body is cancelled through its reader, not only by aborting
  // the fetch: an aborted body nobody cancels errors inside the runtime,
  // which workerd logs as an uncaught "Network connection lost".
  client.whenGone(() => {
    reader.cancel().catch(() => {});
    call.abort();
  });
  client.send(held.head);
  const firstByteAt = Date.now();

  // Read eagerly rather than when the client pulls: every chunk the engine
  // sends is parsed for usage at once, so on a disconnect the last usage
  // seen is as close as possible to what the engine generated.
  const pump = async (): Promise<End> => {
    try {
      while (!tracker.done && !tracker.error) {
        const r = await reader.read();
        if (r.done) {
          for (const ev of splitter.end()) client.send(tracker.event(ev));
          break;
        }
        watchdog.touch();
        // Most chunks are one whole event and never become text (see
        // StreamUsage.chunk); the rest go through the splitter.
        const fast = splitter.idle ? tracker.chunk(r.value) : undefined;
        if (fast !== undefined) client.write(fast);
        else {
          let out = "";
          for (const ev of splitter.push(decoder.decode(r.value, { stream: true }))) out += tracker.event(ev);
          client.send(out);
        }
        await client.drained();
      }
    } catch (err) {
      call.abort();
      if (client.gone) return { kind: "left" };
      const finished = tracker.finished.size > 0;
      return { kind: "cut", failure: thrownFailure(endpoint.id, "relay", err, watchdog.fired, finished) };
    } finally {
      watchdog.stop();
    }
    if (client.gone) return { kind: "left" };
    if (!tracker.error && tracker.complete(choicesAsked(input.body, input.apiPath)))
      return { kind: "answered" };
    return { kind: "cut", failure: earlyEnd(endpoint.id, "relay", tracker.finished.size > 0, tracker.error) };
  };

  return pump()
    .catch((): End => ({ kind: "left" }))
    .then(async (end) => {
      const counted = countedUsage(tracker.usage, input.promptTokens, tracker.relayed);
      if (end.kind === "answered") {
        client.close(tracker.closing(counted.usage));
        if (tracker.done) await readToEnd(reader);
      }
      // An engine's own error event has gone out already.
      else if (end.kind === "cut")
        client.close(tracker.error ? "" : errorEventFor(input.apiPath, end.failure.error.body()));
      else client.close("");
      return { ...outcomeOf(where(call), end, counted), firstByteAt };
    });
}
