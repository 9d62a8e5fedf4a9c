/**
 * The sim engine's "embedding model": a deterministic vector per input, cheap
 * enough to compute for a whole prompt on the event loop.
 *
 * An input's vector is a bag of its tokens (the same token ids the prompt is
 * billed by, BOS left out): every distinct token id has a fixed pseudo-random
 * direction in EMBEDDING_DIM dimensions, derived from a hash of the id, and
 * the vector is the sum of those directions weighted by how often the token
 * occurs, L2-normalised. So equal text always gives the same vector, a text
 * and its token ids give the same vector, and texts that share tokens point
 * in similar directions (unrelated ones are close to orthogonal), which is
 * enough for a retrieval demo. Token order does not matter.
 *
 * `dimensions` (Matryoshka style, as OpenAI's text-embedding-3 models and
 * vLLM's matryoshka models do it): the first `dimensions` components of the
 * full sum, normalised again.
 */
import { mix32 } from "../common/rng.ts";
import { BOS } from "./text.ts";

/** The served embedding size (that of the small sentence-embedding models, e.g. bge-small, MiniLM). */
export const EMBEDDING_DIM = 384;

const FEATURE_SALT = 0x5bd1e995;

/**
 * The unit vector of a prompt (`promptIds` as the tokenizer gives them,
 * BOS included), as float32 like a model's output; `dimensions` ≤
 * EMBEDDING_DIM. About 0.3 µs per distinct token.
 */
export function embeddingVector(promptIds: readonly number[], dimensions = EMBEDDING_DIM): Float32Array {
  if (!Number.isInteger(dimensions) || dimensions < 1 || dimensions > EMBEDDING_DIM) {
    throw new RangeError(`dimensions must be an integer in 1..${EMBEDDING_DIM}, got ${dimensions}`);
  }
  const counts = new Map<number, number>();
  for (const id of promptIds) if (id !== BOS) counts.set(id, (counts.get(id) ?? 0) + 1);
  // An empty text still has its BOS: every empty input gets the same vector.
  if (counts.size === 0) counts.set(BOS, 1);
  const sum = new Float64Array(dimensions);
  for (const [id, count] of counts) {
    const seed = mix32(id >>> 0, FEATURE_SALT);
    // One 32-bit hash gives four components (a byte each, centred on 0).
    for (let j = 0; j < dimensions; j += 4) {
      const h = mix32(seed, j);
      for (let k = 0; k < 4 && j + k < dimensions; k++) {
        sum[j + k]! += count * (((h >>> (8 * k)) & 0xff) - 127.5);
      }
    }
  }
  let norm = 0;
  for (let j = 0; j < dimensions; j++) norm += sum[j]! * sum[j]!;
  norm = Math.sqrt(norm);
  const out = new Float32Array(dimensions);
  // The byte values are never 0 after centring, but sums can cancel: never divide by zero.
  if (norm === 0) out[0] = 1;
  else for (let j = 0; j < dimensions; j++) out[j] = sum[j]! / norm;
  return out;
}

/** `encoding_format: "base64"` as OpenAI sends it: the float32 values, little-endian, base64. */
export function float32Base64(v: Float32Array): string {
  const bytes = Buffer.alloc(v.length * 4);
  for (let i = 0; i < v.length; i++) bytes.writeFloatLE(v[i]!, i * 4);
  return bytes.toString("base64");
}

/** The inverse of float32Base64 (what the openai client does with a base64 answer). */
export function base64Float32(text: string): Float32Array {
  const bytes = Buffer.from(text, "base64");
  const out = new Float32Array(bytes.length >>> 2);
  for (let i = 0; i < out.length; i++) out[i] = bytes.readFloatLE(i * 4);
  return out;
}
