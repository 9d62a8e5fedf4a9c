/**
 * The sim engine's tokenizer, chat template and deterministic "model output".
 *
 * Billing is compared against the engine's counters, so token counts must be
 * exact, cheap and reproducible by anyone who reads this file:
 *
 * - Text is cut into pieces: a run of letters/digits together with the
 *   whitespace before it (" hello"), a single other character ("," "!"),
 *   or a run of whitespace not followed by a word. Pieces longer than
 *   MAX_PIECE_CHARS are split every MAX_PIECE_CHARS characters (code points).
 *   That lands near the usual ~4 characters per token of English BPE.
 * - A token's id is the FNV-1a hash of its piece, so equal text gives equal
 *   ids and the prefix cache behaves as it would with a real tokenizer.
 * - The chat template is Llama-3 shaped: 1 BOS token, then per message
 *   `<start_header> role <end_header> ...content... <eot>` (4 overhead
 *   tokens), then the generation prompt `<start_header> assistant
 *   <end_header>` (3 tokens). A request's `tools` are one more block before
 *   the messages (`<start_header> tools <end_header>` + the tools' JSON +
 *   `<eot>`), and an assistant message's tool calls add the tokens of each
 *   call's name and arguments to its content.
 */
import { mix32, mulberry32 } from "../common/rng.ts";

export const MAX_PIECE_CHARS = 4;
export const BOS = 0xfff0_0001;
const START_HEADER = 0xfff0_0002;
const END_HEADER = 0xfff0_0003;
const EOT = 0xfff0_0004;
export const CHAT_TOKENS_PER_MESSAGE = 4;
export const CHAT_GENERATION_PROMPT_TOKENS = 3;

const PIECE = /\s*[\p{L}\p{N}]+|[^\s\p{L}\p{N}]|\s+/gu;

export function fnv1a(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

export function tokenPieces(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(PIECE)) {
    const piece = m[0];
    if (piece.length <= MAX_PIECE_CHARS) {
      out.push(piece);
      continue;
    }
    const chars = Array.from(piece);
    for (let i = 0; i < chars.length; i += MAX_PIECE_CHARS) {
      out.push(chars.slice(i, i + MAX_PIECE_CHARS).join(""));
    }
  }
  return out;
}

export function tokenize(text: string, into: number[] = []): number[] {
  for (const piece of tokenPieces(text)) into.push(fnv1a(piece));
  return into;
}

export interface ChatMessage {
  role: string;
  content: string;
  /** An assistant message's tool calls. */
  toolCalls?: readonly { name: string; arguments: string }[];
}

/** `tools`: the request's tools as compact JSON, when it has any. */
export function chatPromptTokens(messages: readonly ChatMessage[], tools?: string): number[] {
  const ids: number[] = [BOS];
  if (tools !== undefined) {
    ids.push(START_HEADER, fnv1a("tools"), END_HEADER);
    tokenize(tools, ids);
    ids.push(EOT);
  }
  for (const m of messages) {
    ids.push(START_HEADER, fnv1a(m.role), END_HEADER);
    tokenize(m.content, ids);
    for (const call of m.toolCalls ?? []) {
      tokenize(call.name, ids);
      tokenize(call.arguments, ids);
    }
    ids.push(EOT);
  }
  ids.push(START_HEADER, fnv1a("assistant"), END_HEADER);
  return ids;
}

export function completionPromptTokens(prompt: string | number[]): number[] {
  if (typeof prompt !== "string") return [BOS, ...prompt];
  return tokenize(prompt, [BOS]);
}

/**
 * Output vocabulary: every output token is exactly one of these pieces, so the
 * text a client receives re-tokenizes to the same count it was billed for.
 */
const VOCAB = (
  "the a of and to in is it for on as was by be are at or an one two new GPU KV per way can run may use" +
  " not has all its our any few key set add end top low big hot warm cold fast slow node edge load step"
)
  .split(" ")
  .map((w) => ` ${w}`)
  .filter((w) => w.length <= MAX_PIECE_CHARS)
  .concat([".", ","]);

export const OUTPUT_VOCAB: readonly string[] = VOCAB;
export const OUTPUT_TOKEN_BASE = 0xfe00_0000;

export function outputTokenText(id: number): string {
  return VOCAB[(id - OUTPUT_TOKEN_BASE) % VOCAB.length] ?? "";
}

export function promptFingerprint(ids: readonly number[]): number {
  let h = 0x811c9dc5;
  for (const id of ids) h = mix32(h, id);
  return h;
}

/**
 * What a request will say and when it would stop on its own ("EOS"), both
 * fixed by the seed and the prompt. The natural length is uniform in
 * [mean/2, 3·mean/2] so a fleet sees a spread of lengths, not a constant.
 * Choice `i` of an `n > 1` request mixes `i` into the seed, so every choice
 * says something else, and choice 0 is what `n: 1` says.
 */
export interface OutputPlan {
  naturalLength: number;
  tokenAt(index: number): number;
  /** The seed the plan was drawn from: everything else about the choice derives from it. */
  seed: number;
}

export function planOutput(
  seed: number,
  promptIds: readonly number[],
  meanLength: number,
  choice = 0,
): OutputPlan {
  let base = mix32(seed >>> 0, promptFingerprint(promptIds));
  if (choice > 0) base = mix32(base, 0x4e3f_0000 + choice);
  const lo = Math.max(1, Math.ceil(meanLength / 2));
  const hi = Math.max(lo, Math.floor((meanLength * 3) / 2));
  const naturalLength = lo + Math.floor(mulberry32(base)() * (hi - lo + 1));
  return {
    naturalLength,
    seed: base,
    tokenAt: (index) => OUTPUT_TOKEN_BASE + (mix32(base, index + 1) % VOCAB.length),
  };
}
