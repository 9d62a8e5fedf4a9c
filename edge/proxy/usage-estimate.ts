/**
 * The tokens a request is charged when the engine reported none: a stream
 * cut before its usage came from an engine without continuous usage, or an
 * engine that sends no usage at all. The edge has no tokenizer, so both
 * halves are estimates, and are marked as such wherever they go
 * (docs/engines.md, "How usage is counted"):
 *
 * - the prompt as admission estimates it (demand.ts): CHARS_PER_TOKEN
 *   characters a token, plus a few tokens per chat message;
 * - the answer as the larger of the chunks that carried text (engines
 *   stream about one token a chunk) and its characters at CHARS_PER_TOKEN.
 *
 * Never zero for a request that reached an engine: a prompt of nothing
 * still costs a token.
 */
import { CHARS_PER_TOKEN, textChars } from "../routing/demand.ts";
import { answerChars, type Relayed, type Usage } from "./sse-usage.ts";

export function estimateUsage(promptTokens: number, relayed: Relayed): Usage {
  const prompt = Math.max(1, promptTokens);
  const completion = Math.max(relayed.chunks, Math.ceil(relayed.chars / CHARS_PER_TOKEN));
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** The engine's usage when it gave one, else the estimate. */
export function countedUsage(
  exact: Usage | undefined,
  promptTokens: number,
  relayed: Relayed,
): { usage: Usage; estimated: boolean } {
  if (exact) return { usage: exact, estimated: false };
  return { usage: estimateUsage(promptTokens, relayed), estimated: true };
}

/** Answer text of a whole (non-streamed) answer, for when its body carries no usage: choices, or a response's output items. */
export function answerText(answer: Readonly<Record<string, unknown>>): Relayed {
  let chars = 0;
  const choices = Array.isArray(answer.choices) ? (answer.choices as unknown[]) : [];
  for (const c of choices)
    if (typeof c === "object" && c !== null) chars += answerChars(c as Record<string, unknown>);
  const output = Array.isArray(answer.output) ? (answer.output as Record<string, unknown>[]) : [];
  for (const item of output) chars += outputItemChars(item);
  return { chars, chunks: 0 };
}

/** A Responses output item's text: a message's parts, a function call's arguments. */
function outputItemChars(item: Record<string, unknown> | null): number {
  if (typeof item !== "object" || item === null) return 0;
  return (typeof item.arguments === "string" ? item.arguments.length : 0) + textChars(item.content);
}
