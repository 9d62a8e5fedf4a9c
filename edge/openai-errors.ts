/**
 * Every error the edge returns has OpenAI's shape,
 * `{"error":{"message","type","param","code"}}`, because clients (the
 * official SDKs first) pick their exception class from the status and read
 * these four fields. Engine errors are rewritten into the same shape.
 */
export interface OpenAIErrorBody {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

export class ApiError extends Error {
  readonly headers: Record<string, string>;
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly code: string | null = null,
    readonly param: string | null = null,
    headers: Record<string, string> = {},
  ) {
    super(message);
    this.headers = headers;
  }

  body(): OpenAIErrorBody {
    return { message: this.message, type: this.type, param: this.param, code: this.code };
  }

  toResponse(extraHeaders: Record<string, string> = {}): Response {
    return new Response(JSON.stringify({ error: this.body() }), {
      status: this.status,
      headers: { "content-type": "application/json", ...this.headers, ...extraHeaders },
    });
  }
}

/** The OpenAI `type` that goes with a status, for errors that carry none we trust. */
export function typeForStatus(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "invalid_request_error";
  if (status === 429) return "rate_limit_error";
  if (status === 503) return "service_unavailable_error";
  if (status === 504) return "timeout_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/** Both headers: openai-node prefers `retry-after-ms`, everything else reads `Retry-After`. */
export function retryAfterHeaders(ms: number): Record<string, string> {
  const clamped = Math.max(0, Math.ceil(ms));
  return { "retry-after": String(Math.max(1, Math.ceil(clamped / 1000))), "retry-after-ms": String(clamped) };
}

export const errors = {
  invalid: (message: string, param: string | null = null, code: string | null = null) =>
    new ApiError(400, message, "invalid_request_error", code, param),
  unauthorized: (message: string) => new ApiError(401, message, "invalid_request_error", "invalid_api_key"),
  forbidden: (message: string, code: string, param: string | null = null) =>
    new ApiError(403, message, "permission_error", code, param),
  modelNotFound: (model: string) =>
    new ApiError(
      404,
      `The model \`${model}\` does not exist or you do not have access to it.`,
      "invalid_request_error",
      "model_not_found",
      "model",
    ),
  notFound: (message: string) => new ApiError(404, message, "invalid_request_error", "not_found"),
  methodNotAllowed: (message: string) =>
    new ApiError(405, message, "invalid_request_error", "method_not_allowed"),
  tooLarge: (limit: number, decoded = false) =>
    new ApiError(
      413,
      `Request body is larger than the limit of ${limit} bytes${decoded ? " once decoded" : ""}.`,
      "invalid_request_error",
      "request_too_large",
    ),
  unsupportedEncoding: (encoding: string) =>
    new ApiError(
      415,
      `Content-Encoding \`${encoding.slice(0, 64)}\` is not supported; send the body unencoded, or encoded with gzip or deflate.`,
      "invalid_request_error",
      "unsupported_content_encoding",
    ),
  badEncoding: (encoding: string) =>
    errors.invalid(`The request body is not valid ${encoding} data.`, null, "invalid_content_encoding"),
  rateLimited: (message: string, code: string, retryAfterMs: number) =>
    new ApiError(429, message, "rate_limit_error", code, null, retryAfterHeaders(retryAfterMs)),
  // The budget is spent: retrying within the period cannot succeed, so tell
  // clients not to (openai-node honours x-should-retry).
  quotaExhausted: (message: string, retryAfterMs: number) =>
    new ApiError(429, message, "insufficient_quota", "insufficient_quota", null, {
      ...retryAfterHeaders(retryAfterMs),
      "x-should-retry": "false",
    }),
  noCapacity: (message: string, code = "no_capacity") =>
    new ApiError(503, message, "service_unavailable_error", code, null, retryAfterHeaders(1000)),
  timeout: (message: string, code: string) => new ApiError(504, message, "timeout_error", code),
  internal: (message: string) => new ApiError(500, message, "server_error", "internal_error"),
};

function asString(v: unknown): string | null {
  if (typeof v === "string") return v;
  return null;
}

const MAX_MESSAGE = 500;

/** FastAPI's validation entry: `{"loc":["body","messages",0],"msg":"…","type":"…"}`. */
interface FastApiIssue {
  loc?: unknown;
  msg?: unknown;
}

/** The request field a FastAPI issue names: its location past `body`. */
function fastApiParam(detail: unknown): string | null {
  if (!Array.isArray(detail)) return null;
  const loc = (detail[0] as FastApiIssue | undefined)?.loc;
  if (!Array.isArray(loc)) return null;
  const path = loc.filter((p, i) => !(i === 0 && p === "body")).map(String);
  return path.length > 0 ? path.join(".") : null;
}

/** FastAPI's `detail`: a message, or a list of validation issues, each said as `where: what`. */
function fastApiMessage(detail: unknown): string | null {
  if (typeof detail === "string") return detail;
  if (!Array.isArray(detail)) return asString((detail as { message?: unknown } | null)?.message);
  const parts = detail.map((d: FastApiIssue | string) => {
    if (typeof d !== "object" || d === null) return String(d);
    const where = Array.isArray(d.loc) ? d.loc.map(String).join(".") : "";
    const what = asString(d.msg) ?? JSON.stringify(d);
    return where ? `${where}: ${what}` : what;
  });
  return parts.length > 0 ? parts.join("; ") : null;
}

/** An HTML error page (a proxy's, a framework's) as its title or first heading, tags stripped. */
function htmlMessage(text: string): string | null {
  if (!/^\s*<(!doctype\s+html|html|head|body|title|h1)\b/i.test(text)) return null;
  const pick = /<title[^>]*>([\s\S]*?)<\/title>/i.exec(text) ?? /<h1[^>]*>([\s\S]*?)<\/h1>/i.exec(text);
  const inner = pick?.[1] ?? text;
  const plain = inner
    .replace(/<(script|style)[^>]*>[\s\S]*?<\/\1>/gi, " ")
    .replace(/<[^>]*>/g, " ")
    .replace(/&nbsp;/g, " ")
    .replace(/&amp;/g, "&")
    .replace(/&lt;/g, "<")
    .replace(/&gt;/g, ">")
    .replace(/\s+/g, " ")
    .trim();
  return plain || null;
}

/**
 * An engine's error in OpenAI's shape, whatever shape it came in: OpenAI's
 * and vLLM's `{"error":{"message","type","param","code":<int>}}`, older
 * vLLM's flat `{"object":"error","message",...}`, FastAPI's `{"detail":…}`
 * (a string, or a list of validation issues), a JSON string, an HTML error
 * page, or plain text (docs/engines.md). vLLM's `code` is the HTTP status
 * as an int, which no OpenAI client expects, so only string codes survive.
 * vLLM's `type` is a Python class name (`BadRequestError`); the status
 * decides the type instead.
 */
export function normaliseEngineError(status: number, text: string): OpenAIErrorBody {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const obj = typeof parsed === "object" && parsed !== null ? (parsed as Record<string, unknown>) : undefined;
  const inner =
    obj && typeof obj.error === "object" && obj.error !== null ? (obj.error as Record<string, unknown>) : obj;
  const message =
    asString(inner?.message) ??
    asString(inner?.error) ??
    (inner && "detail" in inner ? fastApiMessage(inner.detail) : null) ??
    asString(parsed) ??
    htmlMessage(text) ??
    (text.trim() || `engine returned HTTP ${status}`);
  return {
    message: message.length > MAX_MESSAGE ? `${message.slice(0, MAX_MESSAGE - 1)}…` : message,
    type: typeForStatus(status),
    param: asString(inner?.param) ?? fastApiParam(inner?.detail),
    code: asString(inner?.code),
  };
}

/** An error event for a stream whose headers are already out: openai-node throws on `data: {"error":…}`. */
export function sseErrorEvent(err: OpenAIErrorBody): string {
  return `data: ${JSON.stringify({ error: err })}\n\n`;
}

/**
 * The same for a Responses API stream: its `error` event (`type`, `code`,
 * `message`, `param`), which also carries the `error` object openai-node
 * throws on, so the SDK raises it as it does a chat stream's.
 */
export function responsesErrorEvent(err: OpenAIErrorBody): string {
  const { code, message, param } = err;
  return `event: error\ndata: ${JSON.stringify({ type: "error", code, message, param, error: err })}\n\n`;
}
