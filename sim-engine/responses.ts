/**
 * OpenAI's Responses API (`POST /v1/responses`) as vLLM serves it to a text
 * model without a reasoning or tool parser: the input becomes chat messages
 * (vLLM's construct_input_messages), so a response's prompt, prefix caching
 * and output are exactly those of the chat request with the same messages,
 * and the answer is one assistant message. What needs state or tools
 * (`previous_response_id`, `tools`) is refused by request-plan.ts.
 *
 * The bodies and events are template strings, as in protocol.ts: a stream
 * writes one event per output token. Pure: the ids come from the caller.
 */
import { z } from "zod";
import { ApiError, MaxTokens, type ResponseFormat, zodToApiError } from "./protocol.ts";
import type { ChatMessage } from "./text.ts";

/** `text.format` as the Responses API has it: the schema's fields sit beside `type`. */
const TextFormat = z.discriminatedUnion("type", [
  z.looseObject({ type: z.literal("text") }),
  z.looseObject({ type: z.literal("json_object") }),
  z.looseObject({
    type: z.literal("json_schema"),
    name: z.string().min(1),
    schema: z.record(z.string(), z.unknown()).nullish(),
    strict: z.boolean().nullish(),
  }),
]);

export const ResponsesRequest = z.looseObject({
  model: z.string().min(1),
  // Items are checked by responsesMessages, which can name the item and part at fault.
  input: z.union([z.string(), z.array(z.unknown()).min(1)], {
    error: "expected a string or an array of input items",
  }),
  instructions: z.string().nullish(),
  max_output_tokens: MaxTokens,
  temperature: z.number().min(0).nullish(),
  // vLLM's SamplingParams: top_p in (0, 1].
  top_p: z.number().gt(0).max(1).nullish(),
  stream: z.boolean().nullish(),
  seed: z.number().int().nullish(),
  cache_salt: z.string().nullish(),
  user: z.string().nullish(),
  previous_response_id: z.string().nullish(),
  tools: z.array(z.unknown()).nullish(),
  text: z.looseObject({ format: TextFormat.nullish() }).nullish(),
  // store, metadata, parallel_tool_calls, tool_choice, …: accepted and ignored (loose object).
});
export type ResponsesRequest = z.infer<typeof ResponsesRequest>;

const InputMessage = z.looseObject({
  type: z.literal("message").optional(),
  role: z.enum(["user", "assistant", "system", "developer"]),
  content: z.union([z.string(), z.array(z.looseObject({ type: z.string() }))], {
    error: "expected a string or an array of content parts",
  }),
});
const TEXT_PARTS = new Set(["input_text", "output_text"]);

/**
 * The chat messages a Responses request stands for, as vLLM builds them:
 * `instructions` first as a system message, then a string input as one user
 * message, or each input item as a message of its role with its text parts
 * joined. Other item types (function calls, reasoning) and part types
 * (images, files) are refused, as a text model without tools refuses them.
 */
export function responsesMessages(
  instructions: string | null | undefined,
  input: ResponsesRequest["input"],
): ChatMessage[] {
  const out: ChatMessage[] = [];
  if (instructions !== null && instructions !== undefined)
    out.push({ role: "system", content: instructions });
  if (typeof input === "string") out.push({ role: "user", content: input });
  else for (const [i, item] of input.entries()) out.push(inputMessage(item, i));
  return out;
}

function inputMessage(item: unknown, i: number): ChatMessage {
  const type = typeof item === "object" && item !== null ? (item as { type?: unknown }).type : undefined;
  if (type !== undefined && type !== "message") {
    throw new ApiError(
      400,
      `input.${i}.type: input items of type ${JSON.stringify(type)} are not supported by the sim engine (only messages are)`,
      `input.${i}.type`,
    );
  }
  const parsed = InputMessage.safeParse(item);
  if (!parsed.success) throw zodToApiError(parsed.error, ["input", i]);
  const { role, content } = parsed.data;
  if (typeof content === "string") return { role, content };
  let text = "";
  for (const [k, part] of content.entries()) {
    const t = (part as { text?: unknown }).text;
    if (!TEXT_PARTS.has(part.type) || typeof t !== "string") {
      throw new ApiError(
        400,
        `content part type "${part.type}" is not supported by this model`,
        `input.${i}.content.${k}`,
      );
    }
    text += t;
  }
  return { role, content: text };
}

/** `text.format` in chat's `response_format` shape, so the chat planner draws the output. */
export function responseFormatOf(r: ResponsesRequest): ResponseFormat | null {
  const f = r.text?.format;
  if (f?.type !== "json_schema") return f ?? null;
  return { type: "json_schema", json_schema: { name: f.name, schema: f.schema } };
}

/** What the response object repeats of its request. */
export interface ResponseEcho {
  /** `resp_…` */
  id: string;
  /** The output message's id, `msg_…`. */
  itemId: string;
  created: number;
  model: string;
  instructions: string | null;
  maxOutputTokens: number | null;
  temperature: number;
  topP: number;
}

export interface ResponseUsage {
  input: number;
  cached: number;
  output: number;
}

export function responseUsageJson(u: ResponseUsage): string {
  return `{"input_tokens":${u.input},"input_tokens_details":{"cached_tokens":${u.cached}},"output_tokens":${u.output},"output_tokens_details":{"reasoning_tokens":0},"total_tokens":${u.input + u.output}}`;
}

/** `length` leaves the answer incomplete; an answer that ended by itself is complete. */
const statusOf = (finish: string): "completed" | "incomplete" =>
  finish === "length" ? "incomplete" : "completed";

const textPart = (text: string): string =>
  `{"type":"output_text","text":${JSON.stringify(text)},"annotations":[]}`;

/**
 * One response's bodies: the whole JSON answer, or its stream of
 * `event: <type>\ndata: {...}\n\n` events numbered by `sequence_number`
 * (vLLM sends no `data: [DONE]` after them). `usage` is always the
 * response object's last key, so a reader can find it at the end.
 */
export class ResponseWriter {
  private seq = 0;
  /** The response object up to its status. */
  private readonly head: string;
  /** From `instructions` to `top_p`. */
  private readonly echo: string;
  /** What a text part's events name it by. */
  private readonly part: string;
  private readonly itemId: string;

  constructor(r: ResponseEcho) {
    this.itemId = r.itemId;
    this.head = `{"id":"${r.id}","object":"response","created_at":${r.created},"model":${JSON.stringify(r.model)},`;
    this.echo = `"instructions":${r.instructions === null ? "null" : JSON.stringify(r.instructions)},"max_output_tokens":${r.maxOutputTokens ?? "null"},"temperature":${r.temperature},"top_p":${r.topP}`;
    this.part = `"item_id":"${r.itemId}","output_index":0,"content_index":0`;
  }

  /** The whole answer, not streamed. */
  body(text: string, finish: string, usage: ResponseUsage): string {
    const status = statusOf(finish);
    return this.object(status, this.message(status, textPart(text)), responseUsageJson(usage));
  }

  /** `response.created` and `response.in_progress`: sent with the stream's head, before any token. */
  opening(): string {
    const response = this.object("in_progress", "", "null");
    return (
      this.event("response.created", `"response":${response}`) +
      this.event("response.in_progress", `"response":${response}`)
    );
  }

  /** One output token's event; the first token's also opens the message and its text part. */
  delta(piece: string, first: boolean): string {
    let out = "";
    if (first) {
      out += this.event(
        "response.output_item.added",
        `"output_index":0,"item":${this.message("in_progress", "")}`,
      );
      out += this.event("response.content_part.added", `${this.part},"part":${textPart("")}`);
    }
    return (
      out +
      this.event("response.output_text.delta", `${this.part},"delta":${JSON.stringify(piece)},"logprobs":[]`)
    );
  }

  /** The events after the last token, ending with `response.completed` (whatever the status, as vLLM). */
  closing(text: string, finish: string, usage: ResponseUsage): string {
    const status = statusOf(finish);
    const part = textPart(text);
    const item = this.message(status, part);
    return (
      this.event("response.output_text.done", `${this.part},"text":${JSON.stringify(text)},"logprobs":[]`) +
      this.event("response.content_part.done", `${this.part},"part":${part}`) +
      this.event("response.output_item.done", `"output_index":0,"item":${item}`) +
      this.event("response.completed", `"response":${this.object(status, item, responseUsageJson(usage))}`)
    );
  }

  private event(type: string, fields: string): string {
    return `event: ${type}\ndata: {"type":"${type}","sequence_number":${this.seq++},${fields}}\n\n`;
  }

  private message(status: string, content: string): string {
    return `{"id":"${this.itemId}","type":"message","role":"assistant","status":"${status}","content":[${content}]}`;
  }

  /** `output` and `usage` are rendered; an in-progress response has no output yet and usage `null`. */
  private object(status: string, output: string, usage: string): string {
    const incomplete = status === "incomplete" ? `{"reason":"max_output_tokens"}` : "null";
    return `${this.head}"status":"${status}","incomplete_details":${incomplete},${this.echo},"output":[${output}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"error":null,"usage":${usage}}`;
  }
}
