/**
 * A request's predicted demand on an engine, from its body alone (the edge
 * has no tokenizer): the prompt at CHARS_PER_TOKEN characters a token, the
 * answer at its `max_tokens` (or `max_completion_tokens`) per choice, or an
 * assumption when it names none. An estimate for admission, not a bound
 * (the key's ledger reserves a bound, edge/keys/reservations.ts): English text with
 * Llama-3's or GPT-4's tokenizer runs near 4 characters a token, code and
 * other languages fewer, so a prompt may hold up to about twice the
 * estimate; the scraped KV use corrects the pool when it does. A Responses
 * API request is read as the chat request it stands for (conversation.ts).
 */
import type { Demand } from "./types.ts";

export const CHARS_PER_TOKEN = 4;

type Body = Readonly<Record<string, unknown>>;

const num = (v: unknown): number | undefined => (typeof v === "number" && v >= 0 ? v : undefined);

/** Characters of a message's content: a string, or the text of its parts. */
export function textChars(content: unknown): number {
  if (typeof content === "string") return content.length;
  if (!Array.isArray(content)) return 0;
  let n = 0;
  for (const part of content as { text?: unknown }[])
    if (typeof part?.text === "string") n += part.text.length;
  return n;
}

/** Tokens of a completion prompt or an embedding input: text, token ids, or a list of either. */
function inputTokens(v: unknown): number {
  if (typeof v === "string") return Math.ceil(v.length / CHARS_PER_TOKEN);
  if (!Array.isArray(v)) return 0;
  if (v.length > 0 && typeof v[0] === "number") return v.length;
  let n = 0;
  for (const item of v) n += inputTokens(item);
  return n;
}

export function promptTokens(body: Body): number {
  const messages = body.messages;
  if (Array.isArray(messages)) {
    let chars = 0;
    // Each message's role and the template's markers around it: a few tokens.
    for (const m of messages as { content?: unknown }[]) chars += textChars(m?.content) + 4 * CHARS_PER_TOKEN;
    return Math.ceil(chars / CHARS_PER_TOKEN);
  }
  return inputTokens(body.prompt ?? body.input);
}

/** `generates: false` for embeddings; `assumedOutput` for a request that names no limit. */
export function predictDemand(body: Body, generates: boolean, assumedOutput: number): Demand {
  if (!generates) return { promptTokens: promptTokens(body), outputTokens: 0 };
  const max = num(body.max_completion_tokens) ?? num(body.max_tokens) ?? assumedOutput;
  return {
    promptTokens: promptTokens(body),
    outputTokens: (num(body.n) ?? 1) * max,
    reportsFirstToken: body.stream === true,
  };
}
