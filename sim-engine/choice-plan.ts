/**
 * What one choice of a generation request says, token by token: free text
 * (text.ts's plan), a JSON value (response_format), or a tool call's
 * arguments. Structured outputs are rendered whole up front and cut into
 * the tokenizer's own pieces, so each output token is one piece, the text
 * a client receives re-tokenizes to exactly `completion_tokens`, and the
 * output ends ("EOS") when the value is complete.
 */

import { mix32, mulberry32 } from "../common/rng.ts";
import { sampleJsonObject, sampleSchema } from "./json-values.ts";
import { fnv1a, outputTokenText, planOutput, tokenPieces } from "./text.ts";

export type OutputShape =
  | { kind: "text" }
  | { kind: "json_object" }
  /** `schema` was checked with checkSchema. */
  | { kind: "json_schema"; schema: unknown }
  /** A tool call: `parameters` (checked) shapes its arguments; absent, they are `{}`. */
  | { kind: "tool"; name: string; parameters: unknown };

export interface ChoicePlan {
  /** Tokens after which the choice ends by itself; Infinity: only max_tokens ends it. */
  naturalLength: number;
  tokenAt(index: number): number;
  /** The text of output token `index`, whose id (from tokenAt) is `token`. */
  pieceAt(index: number, token: number): string;
  /** Seeds what else is made up about this choice (logprobs). */
  seed: number;
  /** Set when the choice's tokens are a call's arguments. */
  toolName?: string;
}

/**
 * @throws SchemaError when a schema admits no value the generator can make
 *   (a recursion that never ends, bounds nothing satisfies).
 */
export function planChoice(
  seed: number,
  promptIds: readonly number[],
  meanLength: number,
  choice: number,
  shape: OutputShape,
  ignoreEos: boolean,
): ChoicePlan {
  const text = planOutput(seed, promptIds, meanLength, choice);
  if (shape.kind === "text") {
    return {
      naturalLength: ignoreEos ? Number.POSITIVE_INFINITY : text.naturalLength,
      tokenAt: text.tokenAt,
      pieceAt: (_i, token) => outputTokenText(token),
      seed: text.seed,
    };
  }
  const rand = mulberry32(mix32(text.seed, 0x6a50_0001));
  let value: unknown;
  if (shape.kind === "json_object") value = sampleJsonObject(rand, text.naturalLength);
  else if (shape.kind === "json_schema") value = sampleSchema(shape.schema, rand);
  else value = shape.parameters ? sampleSchema(shape.parameters, rand) : {};
  const pieces = tokenPieces(JSON.stringify(value));
  return {
    // A complete value has nothing after it: ignore_eos cannot extend it.
    naturalLength: pieces.length,
    tokenAt: (i) => fnv1a(pieces[i] ?? ""),
    pieceAt: (i) => pieces[i] ?? "",
    seed: text.seed,
    ...(shape.kind === "tool" ? { toolName: shape.name } : {}),
  };
}
