import { type ApiError, errors } from "./openai-errors.ts";

/**
 * A request id: the one name a client, the access log and the error log
 * share for a request.
 */
export function newRequestId(): string {
  return `req_${crypto.randomUUID().replaceAll("-", "")}`;
}

/**
 * An error nothing handled: its message may name internals (a KV key, a
 * setting, a stack), so it stays in the log, and the client gets a generic
 * OpenAI-shaped 500 with the request id to quote.
 */
export function unhandledError(err: unknown, requestId: string): Response {
  console.error("unhandled error", requestId, err);
  return gatewayFailure(requestId).toResponse({ "x-request-id": requestId });
}

/** What the client is told of such an error: nothing but the request id to quote. */
export function gatewayFailure(requestId: string): ApiError {
  return errors.internal(`The gateway failed to handle this request (request id ${requestId}).`);
}
