/**
 * A prompt as chained hashes of 64-character blocks (the approximate prefix
 * routing of the Inference Extension; docs/routing.md): h_i = H(h_{i−1}, block_i),
 * with h_{−1} seeded by the model and `cache_salt`. Equal hashes at position
 * i mean equal text up to the end of block i, which is what an engine's
 * prefix cache would reuse, so the pool can score an endpoint by the
 * longest run of a request's hashes it has seen.
 *
 * Characters, not tokens: the edge has no tokenizer, and 64 characters
 * (about 16 tokens) is fine-grained enough to tell prompts apart. Only whole
 * blocks count, and at most MAX_BLOCKS (16 KiB of text, ~4k tokens): past
 * that the match says nothing new about where a prompt is cached.
 *
 * Hashes are 53-bit integers (two 32-bit lanes), exact in a JS number and
 * cheap to send to the pool.
 */

export const BLOCK_CHARS = 64;
export const MAX_BLOCKS = 256;

const LIMIT = BLOCK_CHARS * MAX_BLOCKS;

function seedOf(text: string): [number, number] {
  let a = 0x811c9dc5;
  let b = 0x9747b28c;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  return [a >>> 0, b >>> 0];
}

/** Block hashes of `text` (only its first MAX_BLOCKS whole blocks). */
export function blockHashes(text: string, seed: string): number[] {
  const blocks = Math.min(MAX_BLOCKS, Math.floor(text.length / BLOCK_CHARS));
  const out = new Array<number>(blocks);
  let [a, b] = seedOf(seed);
  for (let k = 0, i = 0; k < blocks; k++) {
    const end = i + BLOCK_CHARS;
    for (; i < end; i++) {
      const c = text.charCodeAt(i);
      a = Math.imul(a ^ c, 0x01000193);
      b = Math.imul(b ^ c, 0x5bd1e995);
      b ^= b >>> 15;
    }
    // Finalise each lane so nearby texts spread over the whole range.
    a = Math.imul(a ^ (a >>> 16), 0x85ebca6b) >>> 0;
    b = Math.imul(b ^ (b >>> 13), 0xc2b2ae35) >>> 0;
    out[k] = (b & 0x1fffff) * 0x1_0000_0000 + a;
  }
  return out;
}

type Part = { type?: unknown; text?: unknown };

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  let s = "";
  for (const p of content as Part[]) if (p && typeof p.text === "string") s += p.text;
  return s;
}

/**
 * The text a request's prefix is made of: chat messages (a Responses
 * request's as conversation.ts reads them) as role and content in order,
 * or a completion's prompt (token ids as text). Built only
 * as far as the hashes reach.
 */
export function promptText(body: Record<string, unknown>): string {
  const messages = body.messages;
  if (Array.isArray(messages)) {
    let s = "";
    for (const m of messages as { role?: unknown; content?: unknown }[]) {
      s += `${String(m?.role ?? "")}\n${contentText(m?.content)}\n`;
      if (s.length >= LIMIT) break;
    }
    return s;
  }
  const prompt = body.prompt;
  if (typeof prompt === "string") return prompt;
  if (Array.isArray(prompt) && prompt.length > 0) {
    const first = prompt[0];
    if (typeof first === "string") return first;
    if (typeof first === "number") return (prompt as number[]).slice(0, LIMIT / 6).join(",");
    if (Array.isArray(first)) return (first as number[]).slice(0, LIMIT / 6).join(",");
  }
  return "";
}

/** The hashes the Worker sends with `admit`; requests with another cache_salt never match. */
export function requestPrefixHashes(model: string, body: Record<string, unknown>): number[] {
  const salt = typeof body.cache_salt === "string" ? body.cache_salt : "";
  return blockHashes(promptText(body), `${model}\u0000${salt}`);
}
