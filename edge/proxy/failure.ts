/**
 * What went wrong with one attempt, and what a finished attempt comes to.
 * Pure: every way an attempt can fail becomes one Failure here — the
 * engine's error status and body, a thrown error (and which timer, if any,
 * fired), or a stream that ended early — and every way it can end becomes
 * one Outcome in outcomeOf(). The proxy's shell (attempt.ts) only reports
 * which of these happened.
 *
 * The breaker hears a failure only when the engine really failed
 * (docs/edge.md, "Retries, breakers"): no first byte, a connection error,
 * a stream cut before any choice finished, or an engine refusing the edge's
 * own key (401, 403). An engine's other 4xx is a live engine refusing the
 * caller; a stream cut after an answer finished lost the client some text,
 * but the engine was working.
 */
import { ApiError, errors, normaliseEngineError, type OpenAIErrorBody } from "../openai-errors.ts";
import type { Verdict } from "../routing/pool-core.ts";
import type { Usage } from "./sse-usage.ts";
import { PhaseTimeout } from "./timeouts.ts";

/**
 * Where an attempt stood. Before `relay` the client has no byte yet, so a
 * failure is answered with a status and another endpoint may be tried;
 * during `relay` it becomes an SSE error event and the stream's end.
 */
export type Stage = "connect" | "read" | "first_token" | "relay";

export interface Failure {
  /** What the client is told: the response's status and body, or the error event. */
  error: ApiError;
  /** Another endpoint may be tried (never once the client has a byte). */
  retryable: boolean;
  /** What the endpoint's breaker hears. */
  verdict: Verdict;
}

/** The statuses another engine may answer differently. */
const RETRYABLE_STATUS = new Set([408, 429, 500, 502, 503, 504]);

function failed(stage: Stage, error: ApiError, engineFault: boolean): Failure {
  return {
    error,
    retryable: stage !== "relay" && engineFault,
    verdict: engineFault ? "fail" : "ok",
  };
}

/**
 * The statuses with which an engine refuses whoever calls it: there the
 * caller is the edge, with the endpoint's key (or none), never the client,
 * whose key the edge checked and did not pass on.
 */
const REFUSED_STATUS = new Set([401, 403]);

/** The engine answered with an error status; `body` is what it said, in any shape. */
export function statusFailure(endpoint: string, status: number, body: string): Failure {
  if (REFUSED_STATUS.has(status)) return refusedKey(endpoint, status);
  const e = normaliseEngineError(status, body);
  return {
    error: new ApiError(status, e.message, e.type, e.code, e.param),
    retryable: RETRYABLE_STATUS.has(status),
    verdict: status >= 500 ? "fail" : "ok",
  };
}

/**
 * An engine that refused the edge's key: that endpoint is misconfigured,
 * not the client's request, so it is a failure of the endpoint (retried on
 * the next, heard by its breaker) and the client, when none is left, gets a
 * 502 as from any gateway whose upstream answered wrong, never a 401 that
 * would tell it its own key is bad. The message says what to check; the
 * engine's body is left out, since it could echo what it was sent.
 */
function refusedKey(endpoint: string, status: number): Failure {
  const error = new ApiError(
    502,
    `The engine (${endpoint}) refused the edge's key (HTTP ${status}): check that the key pushed for this endpoint (api_key_env, for a static one) is the one the engine was started with (--api-key)${status === 403 ? "; through a tunnel, also the Worker's Access service token" : ""}.`,
    "server_error",
    "upstream_unauthorized",
  );
  return { error, retryable: true, verdict: "fail" };
}

/**
 * A fetch or a read that threw. `fired` is the timer that aborted it, if
 * one did: then the timeout is the failure, not the abort it caused.
 * `finished`: some choice had finished before (a stream's relay only).
 */
export function thrownFailure(
  endpoint: string,
  stage: Stage,
  err: unknown,
  fired: PhaseTimeout | undefined,
  finished = false,
): Failure {
  const timeout = fired ?? (err instanceof PhaseTimeout ? err : undefined);
  if (timeout) return failed(stage, timeoutError(endpoint, timeout), !finished);
  const why = err instanceof Error ? err.message : String(err);
  const error =
    stage === "connect"
      ? errors.noCapacity(`Could not reach the engine (${endpoint}): ${why}`, "upstream_unreachable")
      : stage === "relay"
        ? midStream(`The engine (${endpoint}) failed mid-stream: ${why}`)
        : errors.noCapacity(
            `The engine (${endpoint}) failed ${stage === "read" ? "while answering" : "before the first token"}: ${why}`,
            "upstream_error",
          );
  return failed(stage, error, !finished);
}

/**
 * The body ended cleanly but the answer had not: before the first token
 * (`first_token`), or with some choice unfinished (`relay`). An engine's
 * own error event ends a stream too, and counts like an early end.
 */
export function earlyEnd(
  endpoint: string,
  stage: Stage,
  finished: boolean,
  engineError?: OpenAIErrorBody,
): Failure {
  if (engineError) {
    const { message, type, code, param } = engineError;
    return failed(stage, new ApiError(500, message, type, code, param), !finished);
  }
  const error =
    stage === "relay"
      ? midStream(`The engine (${endpoint}) closed the stream before finishing the answer.`)
      : errors.noCapacity(
          `The engine (${endpoint}) closed the stream before the first token.`,
          "upstream_error",
        );
  return failed(stage, error, !finished);
}

/**
 * The client went away before its first byte: nothing is retried, and the
 * endpoint's breaker hears neither a success nor a failure. 499, as for a
 * client that leaves while queued, though no one reads it.
 */
export function clientLeft(): Failure {
  return {
    error: new ApiError(
      499,
      "The client closed the request before the first token.",
      "invalid_request_error",
      "client_closed",
    ),
    retryable: false,
    verdict: "abandon",
  };
}

/** A stream cut after the client had bytes: only the error event's body matters, its status never goes out. */
function midStream(message: string): ApiError {
  return new ApiError(502, message, "server_error", "upstream_disconnected");
}

function timeoutError(endpoint: string, t: PhaseTimeout): ApiError {
  if (t.phase === "first_token") {
    return errors.timeout(
      `The engine (${endpoint}) sent no token within ${t.ms} ms (first_token timeout).`,
      "first_token_timeout",
    );
  }
  return errors.timeout(
    `The engine (${endpoint}) timed out (${t.phase} after ${t.ms} ms).`,
    `${t.phase}_timeout`,
  );
}

/** What the request came to, for the access log, the charge and the metrics. */
export interface Outcome {
  status: number;
  usage: Usage | undefined;
  /** The usage is the edge's estimate (docs/engines.md): the engine reported none. */
  usageEstimated: boolean;
  endpointId: string | undefined;
  model: string | undefined;
  attempts: number;
  /** The engine finished the answer (every choice finished, or the whole body came). */
  completed: boolean;
  /** The client went away before the answer ended. */
  disconnected: boolean;
  /** The error code of a failure the edge answered with or ended the stream with. */
  errorCode: string | null;
  /**
   * When a stream's first token went to the client; unset for an answer
   * whose first byte went out with its response.
   */
  firstByteAt?: number;
}

/** An outcome and what the endpoint's breaker hears of it: the verdict, and for a failure why. */
export type Verdicted = Outcome & { verdict: Verdict; why: string | undefined };

/** A failure as its breaker records it: code and message. */
export function reasonOf(f: Failure): string {
  return `${f.error.code ?? f.error.type}: ${f.error.message}`;
}

/** How an attempt (or the request, when nothing could be tried) ended. */
export type End =
  /** The whole answer went out: a body, or a complete stream. */
  | { kind: "answered" }
  /** Before the client had a byte: it gets the failure's status. */
  | { kind: "refused"; failure: Failure }
  /** Mid-stream: the client got what was relayed, then an error event. */
  | { kind: "cut"; failure: Failure }
  /** The client went away mid-stream. */
  | { kind: "left" };

export interface Where {
  endpoint: string | undefined;
  model: string | undefined;
  attempts: number;
}

export interface Counted {
  usage: Usage | undefined;
  estimated: boolean;
}

const NOTHING: Counted = { usage: undefined, estimated: false };

export function outcomeOf(where: Where, end: End, counted: Counted = NOTHING): Verdicted {
  const base = {
    endpointId: where.endpoint,
    model: where.model,
    attempts: where.attempts,
    usage: counted.usage,
    usageEstimated: counted.usage !== undefined && counted.estimated,
  };
  switch (end.kind) {
    case "answered":
      return {
        ...base,
        status: 200,
        completed: true,
        disconnected: false,
        errorCode: null,
        verdict: "ok",
        why: undefined,
      };
    case "refused":
      return {
        ...base,
        status: end.failure.error.status,
        completed: false,
        // Only a client that left is neither the engine's failure nor its success (clientLeft).
        disconnected: end.failure.verdict === "abandon",
        errorCode: end.failure.error.code,
        verdict: end.failure.verdict,
        why: reasonOf(end.failure),
      };
    case "cut":
      return {
        ...base,
        status: 200,
        completed: false,
        disconnected: false,
        errorCode: end.failure.error.code,
        verdict: end.failure.verdict,
        why: reasonOf(end.failure),
      };
    case "left":
      return {
        ...base,
        status: 200,
        completed: false,
        disconnected: true,
        errorCode: "client_closed",
        verdict: "abandon",
        why: undefined,
      };
  }
}
