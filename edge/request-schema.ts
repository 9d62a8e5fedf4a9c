/**
 * What the edge must understand of a request to route and account for it,
 * and nothing more: every object is loose, so vendor extensions (`top_k`,
 * `chat_template_kwargs`, `guided_json`, ...) reach the engine untouched.
 * Types are checked where a wrong one would otherwise reach an engine and
 * come back as a 500 instead of the caller's 400.
 */
import { z } from "zod";
import { formatPath } from "../common/zod-issues.ts";
import { ApiError, errors } from "./openai-errors.ts";

const modelName = z.string().min(1, "must not be empty").max(256, "must be at most 256 characters");
/**
 * At least 1, as vLLM and OpenAI's chat API have it; the sim engine applies
 * the same rule with the same message (sim-engine/protocol.ts).
 */
const maxTokens = z
  .number()
  .int()
  .min(1, { error: (iss) => `must be at least 1, got ${String(iss.input)}` });

const streamOptions = z
  .looseObject({
    include_usage: z.boolean().optional(),
    continuous_usage_stats: z.boolean().optional(),
  })
  .nullish();

const stop = z.union([z.string(), z.array(z.string()).max(16)]).nullish();

const sampling = {
  stream: z.boolean().nullish(),
  stream_options: streamOptions,
  max_tokens: maxTokens.nullish(),
  n: z.number().int().min(1).max(128).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  seed: z.number().int().nullish(),
  stop,
  user: z.string().max(256).nullish(),
};

const contentPart = z.looseObject({ type: z.string().min(1) });

const message = z.looseObject({
  role: z.enum(["system", "developer", "user", "assistant", "tool", "function"]),
  content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
  name: z.string().optional(),
});

export const chatRequest = z.looseObject({
  model: modelName,
  messages: z.array(message).min(1, "must contain at least one message"),
  max_completion_tokens: maxTokens.nullish(),
  ...sampling,
});

// No empty token list, alone or in a batch: an engine refuses it, and an
// engine must not be asked what the edge can refuse itself.
const tokenIds = z.array(z.number().int().min(0)).min(1);
const textOrTokens = z.union([z.string(), z.array(z.string()).min(1), tokenIds, z.array(tokenIds).min(1)]);
export const completionRequest = z.looseObject({
  model: modelName,
  prompt: textOrTokens,
  echo: z.boolean().nullish(),
  ...sampling,
});

export const embeddingRequest = z.looseObject({
  model: modelName,
  input: textOrTokens,
  encoding_format: z.enum(["float", "base64"]).nullish(),
  dimensions: z.number().int().min(1).nullish(),
});

/**
 * The Responses API: `input` a string or a list of items (messages with a
 * role, or a function call's output), `instructions` its system message,
 * `max_output_tokens` its length limit. Everything else (tools, `store`,
 * `previous_response_id`, reasoning, text format) is the engine's to read.
 */
const responseItem = z.looseObject({
  type: z.string().min(1).optional(),
  role: z.enum(["system", "developer", "user", "assistant"]).optional(),
  // Replayed output items may carry `content: null` (a reasoning item's).
  content: z.union([z.string(), z.array(contentPart)]).nullish(),
});
export const responsesRequest = z.looseObject({
  model: modelName,
  input: z.union([z.string(), z.array(responseItem).min(1, "must contain at least one item")]),
  instructions: z.string().nullish(),
  max_output_tokens: maxTokens.nullish(),
  stream: z.boolean().nullish(),
  temperature: sampling.temperature,
  top_p: sampling.top_p,
  user: sampling.user,
});

export type ChatRequest = z.output<typeof chatRequest>;
export type CompletionRequest = z.output<typeof completionRequest>;
export type EmbeddingRequest = z.output<typeof embeddingRequest>;
export type ProxiedRequest = (ChatRequest | CompletionRequest | EmbeddingRequest) & {
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean; continuous_usage_stats?: boolean } | null;
};

/** A zod result as the 400 a client can act on: the first issue, named by its path. */
export function validate<T>(schema: z.ZodType<T>, body: unknown): T {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw errors.invalid("The request body must be a JSON object.");
  }
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const param = formatPath(issue.path);
  // A union (`input`, `prompt`) reports a missing field as no member matching.
  const typed = issue.code === "invalid_type" || issue.code === "invalid_union";
  const missing = typed && issue.path.length === 1 && (body as Record<string, unknown>)[param] === undefined;
  const what = missing ? "is required" : issue.message;
  throw errors.invalid(`${param || "body"}: ${what}`, param || null);
}

/**
 * The body encodings the edge decodes: those workerd's DecompressionStream
 * supports (`br` and `zstd` it does not). `x-gzip` is gzip's old name.
 */
const DECODABLE = new Map<string, "gzip" | "deflate">([
  ["gzip", "gzip"],
  ["x-gzip", "gzip"],
  ["deflate", "deflate"],
]);

/** The decompression a Content-Encoding calls for, null for none; anything else is a 415. */
function decodingOf(header: string | null): "gzip" | "deflate" | null {
  const encoding = header?.trim().toLowerCase() ?? "";
  if (encoding === "" || encoding === "identity") return null;
  // A Map, not an object: `constructor` or `__proto__` must be an unknown encoding, not a prototype's property.
  const format = DECODABLE.get(encoding);
  if (!format) throw errors.unsupportedEncoding(header!.trim());
  return format;
}

/**
 * An oversized body up to this many times the limit is read to its end and
 * dropped before the 413 goes out. A server that answers while the client is
 * still sending and then closes the connection resets it, and the client
 * (wrangler dev's proxy among them) loses the 413 it was sent: it sees a
 * broken connection instead. Past this bound the refusal stays cheap and the
 * connection is cut.
 */
const DRAIN_FACTOR = 2;

/**
 * Reads at most `limit` bytes. Content-Length is checked first so a large
 * upload is refused before a byte of it is kept; a chunked body (no length)
 * is counted as it arrives and cut off at the limit. Either way an oversized
 * body is then drained (see DRAIN_FACTOR). A gzip or deflate body is
 * decoded, and the limit holds for the decoded bytes too: decoding stops at
 * the first byte past it, so a small body that inflates to gigabytes costs
 * no more memory than one at the limit.
 */
export async function readBodyLimited(req: Request, limit: number): Promise<Uint8Array> {
  const format = decodingOf(req.headers.get("content-encoding"));
  const declared = req.headers.get("content-length");
  if (declared !== null) {
    const n = Number(declared);
    if (!Number.isFinite(n) || n < 0) throw errors.invalid("Invalid Content-Length header.");
    if (n > limit) {
      if (req.body && n <= DRAIN_FACTOR * limit) await drain(req.body.getReader(), n);
      throw errors.tooLarge(limit);
    }
  }
  if (!req.body) return new Uint8Array(0);
  let raw: Uint8Array;
  try {
    // A declared length the runtime enforces (a body cannot run past its
    // Content-Length), so one native read replaces the chunk loop.
    raw =
      declared !== null
        ? new Uint8Array(await req.arrayBuffer())
        : await readLimited(req.body, limit, false, DRAIN_FACTOR * limit);
  } catch (err) {
    if (err instanceof ApiError) throw err;
    // The only stream here is the client's: if it breaks, the client
    // stopped sending. Its request is bad, never the server's fault.
    throw errors.invalid(
      `The request body ended before ${declared !== null ? `the ${declared} bytes its Content-Length declares` : "its last chunk"}: the connection closed while it was being sent.`,
      null,
      "incomplete_body",
    );
  }
  if (format === null) return raw;
  const decoded = new Response(raw).body!.pipeThrough(new DecompressionStream(format));
  try {
    return await readLimited(decoded, limit, true);
  } catch (err) {
    if (err instanceof ApiError) throw err;
    throw errors.badEncoding(req.headers.get("content-encoding")!.trim().toLowerCase());
  }
}

/** `drainTo` is how far the rest of an oversized body is read and dropped (0: not at all, for a decoder's output). */
async function readLimited(
  body: ReadableStream<Uint8Array>,
  limit: number,
  decoded: boolean,
  drainTo = 0,
): Promise<Uint8Array> {
  const reader = body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await drain(reader, drainTo - size);
      throw errors.tooLarge(limit, decoded);
    }
    parts.push(value);
  }
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

export function parseJsonBody(bytes: Uint8Array): unknown {
  if (bytes.byteLength === 0) throw errors.invalid("The request body is empty; expected a JSON object.");
  let text: string;
  try {
    text = decoder.decode(bytes);
  } catch {
    throw errors.invalid("The request body is not valid UTF-8.");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new ApiError(
      400,
      `We could not parse the JSON body of your request: ${(err as Error).message}`,
      "invalid_request_error",
      "invalid_json",
    );
  }
}

/**
 * Reads and drops up to `budget` more bytes, and the end after them;
 * cancels what is left past that. A broken body is no error here.
 */
async function drain(reader: ReadableStreamDefaultReader<Uint8Array>, budget: number): Promise<void> {
  try {
    for (let left = budget; left >= 0; ) {
      const { done, value } = await reader.read();
      if (done) return;
      left -= value.byteLength;
    }
    await reader.cancel();
  } catch {
    // The client stopped sending: nothing left to drain.
  }
}
