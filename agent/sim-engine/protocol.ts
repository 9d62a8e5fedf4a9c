/**
 * The OpenAI surface as vLLM serves it: request validation (zod, unknown
 * fields ignored), error bodies in vLLM's OpenAI-compatible shape (integer
 * `code` equal to the HTTP status), and the JSON/SSE bodies, written as
 * template strings because a busy engine renders one per output token.
 */
import { z } from "zod";
import type { UsageMode } from "../../common/usage-mode.ts";

export class ApiError extends Error {
  readonly status: number;
  readonly type: string;
  readonly param: string | null;

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

const common = {
  model: z.string().nullish(),
  stream: z.boolean().nullish(),
  stream_options: StreamOptions,
  max_tokens: z.number().int().min(1).nullish(),
  n: z.number().int().min(1).nullish(),
  stop: Stop,
  temperature: z.number().min(0).nullish(),
  seed: z.number().int().nullish(),
  ignore_eos: z.boolean().nullish(),
  cache_salt: z.string().nullish(),
  user: z.string().nullish(),
};

const TextPart = z.looseObject({ type: z.literal("text"), text: z.string() });
const Content = z.union([z.string(), z.array(z.looseObject({ type: z.string() })), z.null()]).optional();

export const ChatRequest = z.looseObject({
  ...common,
  messages: z.array(z.looseObject({ role: z.string().min(1), content: Content })).min(1),
  max_completion_tokens: z.number().int().min(1).nullish(),
});
export type ChatRequest = z.infer<typeof ChatRequest>;

export const CompletionRequest = z.looseObject({
  ...common,
  // Element types are checked by promptOf: a zod union over long token arrays builds an
  // issue per element for every branch it rejects, which costs more than the request's prefill.
  prompt: z.union([z.string(), z.array(z.unknown()).min(1)]),
  echo: z.boolean().nullish(),
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

export function zodToApiError(err: z.ZodError): ApiError {
  const issue = err.issues[0]!;
  const param = issue.path.length > 0 ? issue.path.map(String).join(".") : null;
  return new ApiError(400, param ? `${param}: ${issue.message}` : issue.message, param);
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
  /**
   * The chunk for an output token (for chat, the first one comes after the
   * role delta, whose continuous usage is `roleUsage`: no tokens yet).
   */
  token(
    text: string,
    first: boolean,
    finish: string | null,
    usage: string | null,
    roleUsage?: string | null,
  ): string;
  /** Final `choices: []` usage chunk (include_usage). */
  usage(usage: string): string;
}

export function chatChunks(id: string, created: number, model: string, usageMode: UsageMode): ChunkWriter {
  const head = `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[`;
  const tail = (usage: string | null) =>
    usageMode === "none" ? "}\n\n" : `,"usage":${usage ?? "null"}}\n\n`;
  return {
    token(text, first, finish, usage, roleUsage = null) {
      const role = first
        ? `${head}{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]${tail(usageMode === "continuous" ? roleUsage : null)}`
        : "";
      const fin = finish === null ? "null" : `"${finish}","stop_reason":null`;
      return `${role}${head}{"index":0,"delta":{"content":${JSON.stringify(text)}},"logprobs":null,"finish_reason":${fin}}]${tail(usageMode === "continuous" ? usage : null)}`;
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
  const tail = (usage: string | null) =>
    usageMode === "none" ? "}\n\n" : `,"usage":${usage ?? "null"}}\n\n`;
  return {
    token(text, _first, finish, usage) {
      const fin = finish === null ? "null" : `"${finish}"`;
      return `${head}{"index":0,"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${fin},"stop_reason":null}]${tail(usageMode === "continuous" ? usage : null)}`;
    },
    usage: (usage) => `${head}]${tail(usage)}`,
  };
}

export function chatCompletionBody(
  id: string,
  created: number,
  model: string,
  text: string,
  finish: string,
  usage: string,
): string {
  return `{"id":"${id}","object":"chat.completion","created":${created},"model":${JSON.stringify(model)},"choices":[{"index":0,"message":{"role":"assistant","content":${JSON.stringify(text)},"tool_calls":[]},"logprobs":null,"finish_reason":"${finish}","stop_reason":null}],"usage":${usage},"prompt_logprobs":null}`;
}

export function completionBody(
  id: string,
  created: number,
  model: string,
  text: string,
  finish: string,
  usage: string,
): string {
  return `{"id":"${id}","object":"text_completion","created":${created},"model":${JSON.stringify(model)},"choices":[{"index":0,"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":"${finish}","stop_reason":null,"prompt_logprobs":null}],"usage":${usage}}`;
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
