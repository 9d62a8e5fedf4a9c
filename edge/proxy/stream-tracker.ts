import type { OpenAIErrorBody } from "../openai-errors.ts";
import type { Usage } from "./sse-usage.ts";
import type { Relayed } from "./usage-estimate.ts";

/**
 * How the proxy reads an engine's stream, one reader per API behind one
 * interface, so holdFirstToken and relay (attempt.ts) never ask which API
 * a stream speaks: chat and completions streams are StreamUsage's
 * (sse-usage.ts), Responses API streams ResponseEvents' (response-events.ts);
 * attempt.ts's trackerFor() picks one.
 */
export interface StreamTracker {
  /** The engine ended the stream as it should: `[DONE]`, or a Responses stream's terminal event. */
  readonly done: boolean;
  /** The engine's own error event, normalised. */
  readonly error: OpenAIErrorBody | undefined;
  /** Events of the answer itself: the first one is the first token. */
  readonly dataEvents: number;
  /** Parts of the answer that finished (choices, output items): a cut after one is not the engine's failure alone. */
  readonly finished: ReadonlySet<number>;
  /** Answer text relayed while no usage had come, for an estimate. */
  readonly relayed: Relayed;
  /** Usage as the engine reported it so far. */
  readonly usage: Usage | undefined;
  /** A whole event as bytes, forwarded without becoming text, or undefined for event(). */
  chunk(b: Uint8Array): Uint8Array | undefined;
  /** One event (without its blank line); returns what to forward, "" to drop it. */
  event(raw: string): string;
  /** Everything `choices` asked for is there. */
  complete(choices: number): boolean;
  /** What the client's stream ends with once the answer is complete. */
  closing(usage: Usage | undefined): string;
  /** How this API's stream tells its client of a failure after its headers went out. */
  errorEvent(err: OpenAIErrorBody): string;
}
