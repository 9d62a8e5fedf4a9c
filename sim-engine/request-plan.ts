/**
 * What a generation request asks the engine for, decided before anything is
 * scheduled: its prompt's tokens, one plan per choice (text, JSON, a tool
 * call), its output limit and logprobs. vLLM's 400s for what cannot be
 * served are raised here, so a refused request never reaches the scheduler.
 * Pure: the server (server.ts) parses the body and checks the model first.
 */
import { type ChoicePlan, type OutputShape, planChoice } from "./choice-plan.ts";
import type { GenerationSpec } from "./generation.ts";
import { checkSchema, SchemaError } from "./json-values.ts";
import {
  ApiError,
  type ChatRequest,
  type CompletionRequest,
  messageText,
  promptOf,
  type ResponseFormat,
} from "./protocol.ts";
import { type ResponsesRequest, responseFormatOf, responsesMessages } from "./responses.ts";
import { chatPromptTokens, completionPromptTokens } from "./text.ts";
import { type ToolFunction, toolToCall } from "./tool-choice.ts";

/** The engine's flags a plan depends on. */
export interface PlanOptions {
  seed: number;
  outputLen: number;
  /** `--enable-auto-tool-choice` with a `--tool-call-parser`: `tool_choice: "auto"` is served. */
  autoToolChoice?: boolean | undefined;
}

export interface RequestPlan {
  promptIds: number[];
  choices: ChoicePlan[];
  /** What the request asked for, if it did: the context-length check needs it. */
  maxTokens: number | undefined;
  logprobs: GenerationSpec["logprobs"];
}

const SCHEMA_PARAM = "response_format.json_schema.schema";

/** A chat request's plan; `toolsJson` is its tools as the client wrote them, rendered into the prompt. */
export function chatPlan(r: ChatRequest, toolsJson: string | undefined, o: PlanOptions): RequestPlan {
  if (r.top_logprobs && !r.logprobs) {
    throw new ApiError(400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs");
  }
  const messages = r.messages.map((m, i) => ({
    role: m.role,
    content: messageText(m.content, i),
    ...(m.tool_calls ? { toolCalls: m.tool_calls.map((c) => c.function) } : {}),
  }));
  const tools: ToolFunction[] = r.tools?.map((t) => t.function) ?? [];
  const call = toolCall(r, tools, messages.at(-1), o);
  const promptIds = chatPromptTokens(messages, toolsJson);
  let choices: ChoicePlan[];
  if (call) {
    const param = `tools.${tools.indexOf(call)}.function.parameters`;
    const shape: OutputShape = {
      kind: "tool",
      name: call.name,
      parameters: checked(call.parameters, param),
    };
    choices = plans(r, promptIds, shape, param, o);
  } else choices = plans(r, promptIds, outputShape(r.response_format), SCHEMA_PARAM, o);
  return {
    promptIds,
    choices,
    maxTokens: r.max_completion_tokens ?? r.max_tokens ?? undefined,
    logprobs: r.logprobs ? { top: r.top_logprobs ?? 0, greedy: r.temperature === 0 } : null,
  };
}

export function completionPlan(r: CompletionRequest, o: PlanOptions): RequestPlan {
  const promptIds = completionPromptTokens(promptOf(r.prompt));
  return {
    promptIds,
    choices: plans(r, promptIds, outputShape(r.response_format), SCHEMA_PARAM, o),
    maxTokens: r.max_tokens ?? undefined,
    logprobs: r.logprobs != null ? { top: r.logprobs, greedy: r.temperature === 0 } : null,
  };
}

/**
 * A Responses request's plan: its input as chat messages, so it costs and
 * says what the chat request with those messages would (one choice).
 * What the sim cannot serve is refused before anything is scheduled.
 */
export function responsesPlan(r: ResponsesRequest, o: PlanOptions): RequestPlan {
  if (r.previous_response_id !== null && r.previous_response_id !== undefined) {
    throw new ApiError(
      400,
      `previous_response_id: the sim engine stores no responses, so response \`${r.previous_response_id}\` cannot be continued; send the whole conversation in \`input\``,
      "previous_response_id",
    );
  }
  if (r.tools?.length) {
    throw new ApiError(
      400,
      "tools: tools are not supported by the sim engine's Responses API; use /v1/chat/completions for tool calls",
      "tools",
    );
  }
  const promptIds = chatPromptTokens(responsesMessages(r.instructions, r.input));
  const param = "text.format.schema";
  return {
    promptIds,
    choices: plans({ seed: r.seed }, promptIds, outputShape(responseFormatOf(r), param), param, o),
    maxTokens: r.max_output_tokens ?? undefined,
    logprobs: null,
  };
}

/**
 * The tool a chat request's answer calls (tool-choice.ts), after vLLM's
 * checks: `tool_choice` needs `tools`, a named function must be among
 * them, and "auto" (the default when tools are given) needs
 * `--enable-auto-tool-choice` with a `--tool-call-parser`.
 */
function toolCall(
  r: ChatRequest,
  tools: ToolFunction[],
  last: { role: string; content: string } | undefined,
  o: PlanOptions,
): ToolFunction | undefined {
  if (r.tool_choice != null && tools.length === 0) {
    throw new ApiError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice");
  }
  if (tools.length === 0) return undefined;
  const choice = r.tool_choice ?? "auto";
  if (typeof choice === "object" && !tools.some((t) => t.name === choice.function.name)) {
    throw new ApiError(
      400,
      `Tool '${choice.function.name}' has not been passed in \`tools\`.`,
      "tool_choice",
    );
  }
  if (choice === "auto" && !o.autoToolChoice) {
    throw new ApiError(
      400,
      '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
      "tool_choice",
    );
  }
  return toolToCall(tools, choice, last && { role: last.role, text: last.content });
}

/** One plan per choice; `param` names the schema a plan could not be drawn from. */
function plans(
  r: {
    seed?: number | null | undefined;
    n?: number | null | undefined;
    ignore_eos?: boolean | null | undefined;
  },
  promptIds: number[],
  shape: OutputShape,
  param: string,
  o: PlanOptions,
): ChoicePlan[] {
  const seed = r.seed ?? o.seed;
  return Array.from({ length: r.n ?? 1 }, (_, i) => {
    try {
      return planChoice(seed, promptIds, o.outputLen, i, shape, r.ignore_eos === true);
    } catch (err) {
      if (err instanceof SchemaError) throw schemaApiError(err, param);
      throw err;
    }
  });
}

/** What `response_format` asks of the output; a json_schema without a schema is any JSON object. */
function outputShape(format: ResponseFormat | null | undefined, param = SCHEMA_PARAM): OutputShape {
  if (!format || format.type === "text") return { kind: "text" };
  if (format.type === "json_object") return { kind: "json_object" };
  const schema = format.json_schema.schema;
  if (!schema) return { kind: "json_object" };
  return { kind: "json_schema", schema: checked(schema, param) };
}

/** A schema the generator can honour, or the 400 naming where it cannot. */
function checked<T>(schema: T, param: string): T {
  try {
    checkSchema(schema ?? {});
  } catch (err) {
    if (err instanceof SchemaError) throw schemaApiError(err, param);
    throw err;
  }
  return schema;
}

function schemaApiError(err: SchemaError, param: string): ApiError {
  return new ApiError(400, `${param}: ${err.message}`, param);
}
