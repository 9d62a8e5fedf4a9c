/**
 * How a generation's chunks and bodies are written on the wire. The engine
 * underneath (choices, tokens, usage counts) is the same for every persona;
 * what differs between vLLM and SGLang is only the JSON around it: key
 * order, which keys are null or absent, where a choice's finish_reason
 * rides, how usage looks. `generation.ts` writes through a Wire; vLLM's is
 * here (protocol.ts renders it), SGLang's in sglang-wire.ts.
 */
import type { UsageMode } from "../common/usage-mode.ts";
import {
  type ChunkWriter,
  chatChoice,
  chatChunks,
  completionChoice,
  completionChunks,
  contentDelta,
  responseBody,
  toolCallDelta,
  type Usage,
  usageJson,
} from "./protocol.ts";

/** How a choice ended: its finish_reason, and what stopped it (SGLang's `matched_stop`). */
export interface ChoiceEnd {
  index: number;
  finish: string;
  /** The stop string found, the EOS token id for a natural end, null for `length`. */
  matched: string | number | null;
}

/** Where a usage object is written: on a token chunk, on the final usage chunk, or in a whole body. */
export type UsagePlace = "chunk" | "final" | "body";

export interface StreamWriter extends ChunkWriter {
  /** ChunkWriter's token chunk; `matched` is the choice's matched stop once `finish` is set. */
  token(
    index: number,
    delta: string,
    logprobs: string | null,
    finish: string | null,
    usage: string | null,
    matched?: string | number | null,
  ): string;
  /** A chat delta carrying text. */
  content(text: string): string;
  /** A chat delta carrying a piece of a tool call's arguments (the first also names the call). */
  toolCall(first: { id: string; name: string } | null, args: string): string;
  /** Whether a chat choice's finish_reason rides on its last token chunk (else `closing` sends it). */
  readonly finishOnToken: boolean;
  /** What follows the last token of every choice, before the usage chunk: SGLang's finish chunks. */
  closing(ends: readonly ChoiceEnd[]): string;
  usageJson(u: Usage, withDetails: boolean, place: UsagePlace): string;
}

export interface Wire {
  stream(chat: boolean, id: string, created: number, model: string, usageMode: UsageMode): StreamWriter;
  chatChoice(
    index: number,
    content: string | null,
    toolCalls: string,
    logprobs: string | null,
    end: ChoiceEnd,
  ): string;
  completionChoice(index: number, text: string, logprobs: string | null, end: ChoiceEnd): string;
  body(
    chat: boolean,
    id: string,
    created: number,
    model: string,
    choices: readonly string[],
    usage: string,
  ): string;
  /** The line a stream ends with (after the usage chunk). */
  readonly done: string;
}

/** vLLM's OpenAI server, as protocol.ts renders it. */
export const VLLM_WIRE: Wire = {
  stream(chat, id, created, model, usageMode) {
    const base = (chat ? chatChunks : completionChunks)(id, created, model, usageMode);
    return {
      ...base,
      content: contentDelta,
      toolCall: toolCallDelta,
      finishOnToken: true,
      closing: () => "",
      usageJson: (u, withDetails) => usageJson(u, withDetails),
    };
  },
  chatChoice: (index, content, toolCalls, logprobs, end) =>
    chatChoice(index, content, toolCalls, logprobs, end.finish),
  completionChoice: (index, text, logprobs, end) => completionChoice(index, text, logprobs, end.finish),
  body: responseBody,
  done: "data: [DONE]\n\n",
};
