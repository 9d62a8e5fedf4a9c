/**
 * The OpenAI surface as vLLM serves it: request validation (zod, unknown
 * fields ignored), error bodies in vLLM's OpenAI-compatible shape (integer
 * `code` equal to the HTTP status), and the JSON/SSE bodies, written as
 * template strings because a busy engine renders one per output token.
 */
import { z } from "zod";
import type { UsageMode } from "../common/usage-mode.ts";
import { MAX_LOGPROBS, type StepLogprobs, utf8Bytes } from "./logprobs.ts";

export class ApiError extends Error {
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  /** Refused by the request schema (zodToApiError), not by a rule about its content: SGLang types the two apart. */
  validation = false;

  constructor(status: number, message: string, param: string | null = null, type?: string) {
    super(message);
    this.status = status;
    this.param = param;
    this.type = type ?? ERROR_TYPES[status] ?? "InternalServerError";
  }
}

const ERROR_TYPES: Record<number, string> = {
  400: "BadRequestError",
  404: "NotFoundError",
  405: "MethodNotAllowedError",
  413: "RequestEntityTooLargeError",
  500: "InternalServerError",
  503: "ServiceUnavailableError",
};

export const SSE_HEADERS = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
};
export const JSON_HEADERS = { "content-type": "application/json" };

export function errorBody(e: ApiError): string {
  return JSON.stringify({ error: { message: e.message, type: e.type, param: e.param, code: e.status } });
}

const StreamOptions = z
  .looseObject({
    include_usage: z.boolean().nullish(),
    continuous_usage_stats: z.boolean().nullish(),
  })
  .nullish();

const Stop = z.union([z.string(), z.array(z.string()).max(64)]).nullish();

/**
 * At least 1, as vLLM's SamplingParams and OpenAI's chat API have it; the
 * edge applies the same rule with the same message (edge/request-schema.ts).
 */
export const MaxTokens = z
  .number()
  .int()
  .min(1, { error: (iss) => `must be at least 1, got ${String(iss.input)}` })
  .nullish();

/** Choices per request. vLLM sets no bound; the sim's is the edge's (edge/request-schema.ts). */
export const MAX_N = 128;

/** A response format's json_schema and a tool's function: named, described, a JSON schema, strict or not. */
const named = { name: z.string().min(1), description: z.string().nullish(), strict: z.boolean().nullish() };
const jsonSchema = z.record(z.string(), z.unknown()).nullish();

const ResponseFormat = z.discriminatedUnion("type", [
  z.looseObject({ type: z.literal("text") }),
  z.looseObject({ type: z.literal("json_object") }),
  z.looseObject({
    type: z.literal("json_schema"),
    json_schema: z.looseObject({ ...named, schema: jsonSchema }),
  }),
]);
export type ResponseFormat = z.infer<typeof ResponseFormat>;

const common = {
  model: z.string().nullish(),
  stream: z.boolean().nullish(),
  stream_options: StreamOptions,
  max_tokens: MaxTokens,
  n: z.number().int().min(1).max(MAX_N).nullish(),
  stop: Stop,
  temperature: z.number().min(0).nullish(),
  seed: z.number().int().nullish(),
  ignore_eos: z.boolean().nullish(),
  cache_salt: z.string().nullish(),
  user: z.string().nullish(),
  response_format: ResponseFormat.nullish(),
};

const TextPart = z.looseObject({ type: z.literal("text"), text: z.string() });
const Content = z.union([z.string(), z.array(z.looseObject({ type: z.string() })), z.null()]).optional();

const FunctionCall = z.looseObject({ name: z.string(), arguments: z.string() });
const Tool = z.looseObject({
  type: z.literal("function"),
  function: z.looseObject({ ...named, parameters: jsonSchema }),
});
const ToolChoice = z.union([
  z.enum(["none", "auto", "required"]),
  z.looseObject({ type: z.literal("function"), function: z.looseObject({ name: z.string().min(1) }) }),
]);

export const ChatRequest = z.looseObject({
  ...common,
  messages: z
    .array(
      z.looseObject({
        role: z.string().min(1),
        content: Content,
        tool_calls: z.array(z.looseObject({ function: FunctionCall })).nullish(),
      }),
    )
    .min(1),
  max_completion_tokens: MaxTokens,
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(MAX_LOGPROBS).nullish(),
  tools: z.array(Tool).nullish(),
  tool_choice: ToolChoice.nullish(),
});
export type ChatRequest = z.infer<typeof ChatRequest>;

export const CompletionRequest = z.looseObject({
  ...common,
  // Element types are checked by promptOf: a zod union over long token arrays builds an
  // issue per element for every branch it rejects, which costs more than the request's prefill.
  prompt: z.union([z.string(), z.array(z.unknown()).min(1)]),
  echo: z.boolean().nullish(),
  logprobs: z.number().int().min(0).max(MAX_LOGPROBS).nullish(),
});
export type CompletionRequest = z.infer<typeof CompletionRequest>;

const isTokenId = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v) && v >= 0;

/** The one prompt of a completion request: a string or token ids (batches of one are unwrapped). */
export function promptOf(p: CompletionRequest["prompt"]): string | number[] {
  if (typeof p === "string") return p;
  const first = p[0];
  if (typeof first === "string" || Array.isArray(first)) {
    if (p.length > 1) throw new ApiError(400, "batched prompts are not supported by this engine", "prompt");
    if (typeof first === "string") return first;
    if (first.length === 0 || !first.every(isTokenId)) {
      throw new ApiError(400, "prompt: expected a string or an array of token ids", "prompt");
    }
    return first as number[];
  }
  if (!p.every(isTokenId))
    throw new ApiError(400, "prompt: expected a string or an array of token ids", "prompt");
  return p as number[];
}

export const EmbeddingRequest = z.looseObject({
  model: z.string().nullish(),
  // Element types are checked by embeddingInputs, for the same reason as a completion's prompt.
  input: z.union([z.string(), z.array(z.unknown()).min(1)]),
  encoding_format: z.enum(["float", "base64"]).nullish(),
  dimensions: z.number().int().min(1).nullish(),
});
export type EmbeddingRequest = z.infer<typeof EmbeddingRequest>;

/** Inputs per embeddings request, as OpenAI's API limits them (vLLM sets no limit). */
export const MAX_EMBEDDING_INPUTS = 2048;

const BAD_INPUT =
  "input: expected a string, an array of strings, an array of token ids or an array of arrays of token ids";

/** The inputs of an embeddings request, each a string or token ids (one engine sequence each). */
export function embeddingInputs(input: EmbeddingRequest["input"]): (string | number[])[] {
  if (typeof input === "string") return [input];
  const first = input[0];
  if (typeof first === "number") {
    if (!input.every(isTokenId)) throw new ApiError(400, BAD_INPUT, "input");
    return [input as number[]];
  }
  if (input.length > MAX_EMBEDDING_INPUTS) {
    throw new ApiError(
      400,
      `input: at most ${MAX_EMBEDDING_INPUTS} inputs per request, got ${input.length}`,
      "input",
    );
  }
  if (typeof first === "string") {
    if (!input.every((v) => typeof v === "string")) throw new ApiError(400, BAD_INPUT, "input");
    return input as string[];
  }
  if (Array.isArray(first)) {
    for (const v of input) {
      if (!Array.isArray(v) || v.length === 0 || !v.every(isTokenId)) {
        throw new ApiError(400, BAD_INPUT, "input");
      }
    }
    return input as number[][];
  }
  throw new ApiError(400, BAD_INPUT, "input");
}

/**
 * vLLM's EmbeddingResponse. `embeddings` are pre-rendered: a JSON array of
 * floats, or a quoted base64 string.
 */
export function embeddingsBody(
  id: string,
  created: number,
  model: string,
  embeddings: readonly string[],
  usage: string,
): string {
  let data = "";
  for (let i = 0; i < embeddings.length; i++) {
    data += `${i === 0 ? "" : ","}{"index":${i},"object":"embedding","embedding":${embeddings[i]}}`;
  }
  return `{"id":"${id}","object":"list","created":${created},"model":${JSON.stringify(model)},"data":[${data}],"usage":${usage}}`;
}

/** `prefix`: where the parsed value sits in the request body, when it is not the body itself. */
export function zodToApiError(err: z.ZodError, prefix: readonly PropertyKey[] = []): ApiError {
  const issue = err.issues[0]!;
  const path = [...prefix, ...issue.path];
  const param = path.length > 0 ? path.map(String).join(".") : null;
  const e = new ApiError(400, param ? `${param}: ${issue.message}` : issue.message, param);
  e.validation = true;
  return e;
}

/** Flattens chat content (string or text parts) to text; other parts are refused like a text-only vLLM model. */
export function messageText(content: ChatRequest["messages"][number]["content"], index: number): string {
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  let text = "";
  for (const [k, part] of content.entries()) {
    const p = TextPart.safeParse(part);
    if (!p.success) {
      throw new ApiError(
        400,
        `content part type "${part.type}" is not supported by this model`,
        `messages.${index}.content.${k}`,
      );
    }
    text += p.data.text;
  }
  return text;
}

export interface Usage {
  prompt: number;
  completion: number;
  cached?: number;
}

export function usageJson(u: Usage, withDetails: boolean): string {
  const details = withDetails ? `,"prompt_tokens_details":{"cached_tokens":${u.cached ?? 0}}` : "";
  return `{"prompt_tokens":${u.prompt},"total_tokens":${u.prompt + u.completion},"completion_tokens":${u.completion}${details}}`;
}

/** Pre-rendered pieces of one response, so a token costs one string concatenation. */
export interface ChunkWriter {
  /** Chat: a choice's first chunk, the assistant role and no content yet. Completions have none (""). */
  role(index: number, usage: string | null): string;
  /**
   * The chunk for one output token of choice `index`: `delta` is rendered
   * (chat: a delta object from contentDelta/toolCallDelta; completions: the
   * text as a JSON string), `logprobs` too, or null.
   */
  token(
    index: number,
    delta: string,
    logprobs: string | null,
    finish: string | null,
    usage: string | null,
  ): string;
  /** Final `choices: []` usage chunk (include_usage). */
  usage(usage: string): string;
}

function chunkTail(usageMode: UsageMode): (usage: string | null) => string {
  return usageMode === "none" ? () => "}\n\n" : (usage) => `,"usage":${usage ?? "null"}}\n\n`;
}

export function chatChunks(id: string, created: number, model: string, usageMode: UsageMode): ChunkWriter {
  const head = `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[`;
  const tail = chunkTail(usageMode);
  return {
    role: (index, usage) =>
      `${head}{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]${tail(usage)}`,
    token(index, delta, logprobs, finish, usage) {
      const fin = finish === null ? "null" : `"${finish}","stop_reason":null`;
      return `${head}{"index":${index},"delta":${delta},"logprobs":${logprobs ?? "null"},"finish_reason":${fin}}]${tail(usage)}`;
    },
    usage: (usage) => `${head}]${tail(usage)}`,
  };
}

export function completionChunks(
  id: string,
  created: number,
  model: string,
  usageMode: UsageMode,
): ChunkWriter {
  const head = `data: {"id":"${id}","object":"text_completion","created":${created},"model":${JSON.stringify(model)},"choices":[`;
  const tail = chunkTail(usageMode);
  return {
    role: () => "",
    token(index, text, logprobs, finish, usage) {
      const fin = finish === null ? "null" : `"${finish}"`;
      return `${head}{"index":${index},"text":${text},"logprobs":${logprobs ?? "null"},"finish_reason":${fin},"stop_reason":null}]${tail(usage)}`;
    },
    usage: (usage) => `${head}]${tail(usage)}`,
  };
}

export const contentDelta = (text: string): string => `{"content":${JSON.stringify(text)}}`;

/**
 * A streamed tool call, as vLLM streams it: the call's first delta carries
 * its id, type and function name with the first fragment of the arguments,
 * later ones only further fragments. One call per choice: index 0.
 */
export function toolCallDelta(first: { id: string; name: string } | null, args: string): string {
  return first
    ? `{"tool_calls":[{"id":"${first.id}","type":"function","index":0,"function":{"name":${JSON.stringify(first.name)},"arguments":${JSON.stringify(args)}}}]}`
    : `{"tool_calls":[{"index":0,"function":{"arguments":${JSON.stringify(args)}}}]}`;
}

export function toolCallJson(id: string, name: string, args: string): string {
  return `{"id":"${id}","type":"function","function":{"name":${JSON.stringify(name)},"arguments":${JSON.stringify(args)}}}`;
}

/** One entry of chat's `logprobs.content`. */
export function chatLogprob(step: StepLogprobs): string {
  let top = "";
  for (const t of step.top) {
    top += `${top ? "," : ""}{"token":${JSON.stringify(t.token)},"logprob":${t.logprob},"bytes":[${utf8Bytes(t.token)}]}`;
  }
  return `{"token":${JSON.stringify(step.token)},"logprob":${step.logprob},"bytes":[${utf8Bytes(step.token)}],"top_logprobs":[${top}]}`;
}

/** Chat's `logprobs` object over rendered entries (one per token; a stream chunk has one). */
export const chatLogprobs = (entries: readonly string[]): string => `{"content":[${entries.join(",")}]}`;

/**
 * A completion's `logprobs`: per token its text, logprob, offset in the
 * output text (code points) and, as OpenAI documents it, the `top` most
 * likely tokens plus the sampled one when it is not among them.
 */
export function completionLogprobs(steps: readonly { step: StepLogprobs; offset: number }[]): string {
  let offsets = "";
  let values = "";
  let tokens = "";
  let tops = "";
  for (const [k, { step, offset }] of steps.entries()) {
    const sep = k === 0 ? "" : ",";
    offsets += `${sep}${offset}`;
    values += `${sep}${step.logprob}`;
    tokens += `${sep}${JSON.stringify(step.token)}`;
    let dict = "";
    for (const t of step.top) dict += `${dict ? "," : ""}${JSON.stringify(t.token)}:${t.logprob}`;
    if (!step.top.some((t) => t.token === step.token)) {
      dict += `${dict ? "," : ""}${JSON.stringify(step.token)}:${step.logprob}`;
    }
    tops += `${sep}{${dict}}`;
  }
  return `{"text_offset":[${offsets}],"token_logprobs":[${values}],"tokens":[${tokens}],"top_logprobs":[${tops}]}`;
}

/** One choice of a non-streamed chat answer: text (`content`) or a tool call (`content` null). */
export function chatChoice(
  index: number,
  content: string | null,
  toolCalls: string,
  logprobs: string | null,
  finish: string,
): string {
  return `{"index":${index},"message":{"role":"assistant","content":${content === null ? "null" : JSON.stringify(content)},"tool_calls":[${toolCalls}]},"logprobs":${logprobs ?? "null"},"finish_reason":"${finish}","stop_reason":null}`;
}

export function completionChoice(
  index: number,
  text: string,
  logprobs: string | null,
  finish: string,
): string {
  return `{"index":${index},"text":${JSON.stringify(text)},"logprobs":${logprobs ?? "null"},"finish_reason":"${finish}","stop_reason":null,"prompt_logprobs":null}`;
}

/** A whole (not streamed) response; vLLM adds `prompt_logprobs` to a chat one. */
export function responseBody(
  chat: boolean,
  id: string,
  created: number,
  model: string,
  choices: readonly string[],
  usage: string,
): string {
  const object = chat ? "chat.completion" : "text_completion";
  const tail = chat ? `,"prompt_logprobs":null` : "";
  return `{"id":"${id}","object":"${object}","created":${created},"model":${JSON.stringify(model)},"choices":[${choices.join(",")}],"usage":${usage}${tail}}`;
}

export function modelsBody(names: string[], root: string, maxModelLen: number, created: number): string {
  return JSON.stringify({
    object: "list",
    data: names.map((id) => ({
      id,
      object: "model",
      created,
      owned_by: "vllm",
      root,
      parent: null,
      max_model_len: maxModelLen,
      permission: [
        {
          id: `modelperm-${id}`,
          object: "model_permission",
          created,
          allow_create_engine: false,
          allow_sampling: true,
          allow_logprobs: true,
          allow_search_indices: false,
          allow_view: true,
          allow_fine_tuning: false,
          organization: "*",
          group: null,
          is_blocking: false,
        },
      ],
    })),
  });
}
