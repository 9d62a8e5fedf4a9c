/**
 * SGLang's OpenAI wire, as its serving code writes it (in
 * python/sglang/srt/entrypoints/openai/ unless said otherwise):
 *
 * - chat chunks are built by sse_utils.py's msgspec structs: the delta always
 *   carries `reasoning_content` (null or text) and leaves out null role and
 *   content; every choice has `logprobs`, `finish_reason` and `matched_stop`;
 *   `usage` is absent unless set (serving_chat.py, continuous_usage_stats).
 * - a chat choice's last token chunk has `finish_reason: null`: the finish
 *   comes after the last output of every choice, in a chunk of its own with an
 *   empty delta and `matched_stop` (serving_chat.py, "Send finish_reason
 *   chunks for each index that completed").
 * - completion chunks are pydantic dumps (serving_completions.py,
 *   protocol.py): the finish rides on the last token chunk, and `usage` is
 *   always there, null when not reported.
 * - usage is protocol.py's UsageInfo: prompt, total, completion, then
 *   `prompt_tokens_details` (null unless --enable-cache-report found cached
 *   tokens) and `reasoning_tokens`; a completion stream's final usage chunk is
 *   dumped with exclude_none, so a null `prompt_tokens_details` is left out.
 * - whole bodies end with `metadata: {"weight_version": "default"}`; a chat
 *   message carries `reasoning_content` and `tool_calls` (null when none).
 * - every stream ends with `data: [DONE]`.
 */
import type { UsageMode } from "../common/usage-mode.ts";
import type { ApiError, Usage } from "./protocol.ts";
import type { ChoiceEnd, StreamWriter, UsagePlace, Wire } from "./wire.ts";

const DONE = "data: [DONE]\n\n";

const json = (v: string | number | null | undefined) => (v === undefined ? "null" : JSON.stringify(v));

function sglangUsage(u: Usage, withDetails: boolean, dropNullDetails: boolean): string {
  const details = withDetails && (u.cached ?? 0) > 0 ? `{"cached_tokens":${u.cached}}` : null;
  const detailsKey =
    details === null && dropNullDetails ? "" : `,"prompt_tokens_details":${details ?? "null"}`;
  return `{"prompt_tokens":${u.prompt},"total_tokens":${u.prompt + u.completion},"completion_tokens":${u.completion}${detailsKey},"reasoning_tokens":0}`;
}

function chatStream(id: string, created: number, model: string): StreamWriter {
  const head = `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[`;
  const choice = (index: number, delta: string, lp: string | null, finish: string | null, matched: string) =>
    `{"index":${index},"delta":${delta},"logprobs":${lp ?? "null"},"finish_reason":${json(finish)},"matched_stop":${matched}}`;
  return {
    role: (index) =>
      `${head}${choice(index, '{"reasoning_content":null,"role":"assistant","content":""}', null, null, "null")}]}\n\n`,
    token: (index, delta, lp, finish, usage) =>
      `${head}${choice(index, delta, lp, finish, "null")}]${usage === null ? "" : `,"usage":${usage}`}}\n\n`,
    content: (text) => `{"reasoning_content":null,"content":${JSON.stringify(text)}}`,
    toolCall: (first, args) =>
      first
        ? `{"reasoning_content":null,"tool_calls":[{"id":"${first.id}","index":0,"type":"function","function":{"name":${JSON.stringify(first.name)},"arguments":${JSON.stringify(args)}}}]}`
        : `{"reasoning_content":null,"tool_calls":[{"index":0,"function":{"arguments":${JSON.stringify(args)}}}]}`,
    finishOnToken: false,
    closing: (ends) =>
      ends
        .map(
          (e) =>
            `${head}${choice(e.index, '{"reasoning_content":null}', null, e.finish, json(e.matched))}]}\n\n`,
        )
        .join(""),
    usage: (usage) => `${head}],"usage":${usage}}\n\n`,
    usageJson: (u, withDetails) => sglangUsage(u, withDetails, false),
  };
}

function completionStream(id: string, created: number, model: string): StreamWriter {
  const head = `data: {"id":"${id}","object":"text_completion","created":${created},"model":${JSON.stringify(model)},"choices":[`;
  return {
    role: () => "",
    token: (index, text, lp, finish, usage, matched) =>
      `${head}{"index":${index},"text":${text},"logprobs":${lp ?? "null"},"finish_reason":${json(finish)},"matched_stop":${finish === null ? "null" : json(matched)}}],"usage":${usage ?? "null"}}\n\n`,
    content: (text) => JSON.stringify(text),
    toolCall: (_first, args) => JSON.stringify(args),
    finishOnToken: true,
    closing: () => "",
    usage: (usage) => `${head}],"usage":${usage}}\n\n`,
    usageJson: (u, withDetails, place: UsagePlace) => sglangUsage(u, withDetails, place === "final"),
  };
}

export const SGLANG_WIRE: Wire = {
  stream: (chat: boolean, id: string, created: number, model: string, _mode: UsageMode) =>
    chat ? chatStream(id, created, model) : completionStream(id, created, model),
  chatChoice: (index, content, toolCalls, logprobs, end: ChoiceEnd) =>
    `{"index":${index},"message":{"role":"assistant","content":${JSON.stringify(content ?? "")},"reasoning_content":null,"tool_calls":${toolCalls ? `[${toolCalls}]` : "null"}},"logprobs":${logprobs ?? "null"},"finish_reason":"${end.finish}","matched_stop":${json(end.matched)}}`,
  completionChoice: (index, text, logprobs, end) =>
    `{"index":${index},"text":${JSON.stringify(text)},"logprobs":${logprobs ?? "null"},"finish_reason":"${end.finish}","matched_stop":${json(end.matched)}}`,
  body: (chat, id, created, model, choices, usage) =>
    `{"id":"${id}","object":"${chat ? "chat.completion" : "text_completion"}","created":${created},"model":${JSON.stringify(model)},"choices":[${choices.join(",")}],"usage":${usage},"metadata":{"weight_version":"default"}}`,
  done: DONE,
};

/** protocol.py's EmbeddingResponse: no id, no created; each item's `embedding` before its `index`. */
export function sglangEmbeddingsBody(
  model: string,
  vectors: readonly string[],
  promptTokens: number,
): string {
  const data = vectors.map((v, i) => `{"embedding":${v},"index":${i},"object":"embedding"}`).join(",");
  return `{"data":[${data}],"model":${JSON.stringify(model)},"object":"list","usage":${sglangUsage({ prompt: promptTokens, completion: 0 }, false, false)}}`;
}

/** What FastAPI answers for a route or method it does not have. */
const FASTAPI_DETAIL: Record<number, string> = { 404: "Not Found", 405: "Method Not Allowed" };

/**
 * An error body as SGLang writes one: FastAPI's `{"detail": …}` for an
 * unknown route or method; otherwise protocol.py's ErrorResponse, flat (not
 * under `error`), `type` "Bad Request" for a request its schema refused
 * (http_server.py's RequestValidationError handler) and the serving code's
 * own type names for the rest (serving_base.py, create_error_response).
 */
export function sglangErrorBody(e: ApiError): string {
  const detail = FASTAPI_DETAIL[e.status];
  if (detail !== undefined && e.message.startsWith(detail)) return JSON.stringify({ detail });
  const type = e.validation ? "Bad Request" : e.type;
  return JSON.stringify({ object: "error", message: e.message, type, param: null, code: e.status });
}

/** A stream that fails after its headers: serving_base.py's create_streaming_error_response, then [DONE]. */
export function sglangStreamErrorTail(e: ApiError): string {
  return `data: ${JSON.stringify({ error: JSON.parse(sglangErrorBody(e)) })}\n\n${DONE}`;
}
