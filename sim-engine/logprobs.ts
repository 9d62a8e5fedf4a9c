/**
 * Synthetic log-probabilities for `logprobs` / `top_logprobs`: there is no
 * model, so the values are made up, but made up consistently, as a client
 * would check real ones:
 *
 * - each step has a distribution over CANDIDATES tokens: probabilities
 *   strictly decreasing, summing to less than 1 (the rest is the tail of
 *   the vocabulary), so every logprob is < 0 and the list is sorted;
 * - the sampled token (the one the output actually has) sits at a rank
 *   drawn from the top SAMPLED_FROM by those probabilities, always rank 0
 *   with temperature 0 (greedy); its `logprob` is the one at its rank, so
 *   when `top_logprobs` lists it, both agree;
 * - the other candidates are distinct words of the output vocabulary;
 * - everything is a function of (choice seed, token index): the same
 *   request gives the same numbers, streamed or not, and a larger
 *   `top_logprobs` extends the list without changing its head.
 */
import { mix32, mulberry32 } from "../common/rng.ts";
import { OUTPUT_VOCAB } from "./text.ts";

/** vLLM's default `--max-logprobs`: the most `top_logprobs` (chat) or `logprobs` (completions) a request may ask. */
export const MAX_LOGPROBS = 20;
const CANDIDATES = MAX_LOGPROBS;
const SAMPLED_FROM = 5;

export interface TokenLogprob {
  token: string;
  logprob: number;
}

export interface StepLogprobs extends TokenLogprob {
  /** The `top` most likely tokens, most likely first. */
  top: TokenLogprob[];
}

export function stepLogprobs(
  seed: number,
  index: number,
  sampled: string,
  top: number,
  greedy: boolean,
): StepLogprobs {
  const rand = mulberry32(mix32(seed ^ 0x10b9_7a1e, index + 1));
  const p: number[] = [0.35 + 0.6 * rand()];
  let rest = 1 - p[0]!;
  for (let j = 1; j < CANDIDATES; j++) {
    const pj = Math.min(p[j - 1]! * (0.15 + 0.6 * rand()), rest * 0.5);
    p.push(pj);
    rest -= pj;
  }
  let rank = 0;
  if (!greedy) {
    let u = rand() * p.slice(0, SAMPLED_FROM).reduce((a, b) => a + b, 0);
    while (rank < SAMPLED_FROM - 1 && u >= p[rank]!) u -= p[rank++]!;
  }
  const want = Math.min(top, CANDIDATES);
  const list: TokenLogprob[] = [];
  const used = new Set([sampled]);
  for (let j = 0; j < want; j++) {
    let token = sampled;
    if (j !== rank) {
      do token = OUTPUT_VOCAB[Math.floor(rand() * OUTPUT_VOCAB.length)]!;
      while (used.has(token));
      used.add(token);
    }
    list.push({ token, logprob: Math.log(p[j]!) });
  }
  return { token: sampled, logprob: Math.log(p[rank]!), top: list };
}

/** UTF-8 bytes of a token, as OpenAI's `bytes`. */
export function utf8Bytes(text: string): number[] {
  return Array.from(new TextEncoder().encode(text));
}
