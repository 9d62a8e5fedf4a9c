import { eventFields } from "../../common/sse.ts";
import { normaliseEngineError, type OpenAIErrorBody, responsesErrorEvent } from "../openai-errors.ts";
import { readUsage, type StreamTracker, type Usage } from "./sse-usage.ts";

/**
 * A Responses API stream (`POST /v1/responses`), read for what the proxy
 * needs of it. Pure, like StreamUsage (sse-usage.ts), the chat streams'
 * reader.
 *
 * Its events are typed (`event: response.output_text.delta` with the same
 * `type` in the data), and none is rewritten: unlike chat, a Responses
 * stream always ends in one terminal event, `response.completed` (or
 * `response.incomplete`), whose response carries the whole usage
 * (`input_tokens`, `output_tokens`), so there is nothing to ask the engine
 * for and nothing to cut back. There is no `[DONE]`, and the edge adds none.
 *
 * The first token is the first `….delta` event, or the terminal event of an
 * answer with no text: the events before it (`response.created`, the output
 * item and content part announced) come at once from the engine and say
 * nothing of whether it can answer, so they wait with the first token and
 * a failure up to then may still be retried elsewhere. A stream that ends
 * without its terminal event was cut; while no usage has come, the deltas'
 * text is counted for an estimate. An `error` event, or `response.failed`,
 * ends the stream as the engine's own error.
 */
export class ResponseEvents implements StreamTracker {
  done = false;
  error: OpenAIErrorBody | undefined;
  dataEvents = 0;
  /** 0 once an output item has finished: some of the answer is whole. */
  readonly finished = new Set<number>();
  readonly relayed = { chars: 0, chunks: 0 };
  usage: Usage | undefined;

  /** Every event goes through event(): a Responses stream has no byte fast path. */
  chunk(): undefined {
    return undefined;
  }

  event(raw: string): string {
    const { event, data } = eventFields(raw);
    if (data === undefined) return `${raw}\n\n`;
    let obj: Record<string, unknown> | undefined;
    try {
      const parsed: unknown = JSON.parse(data);
      if (typeof parsed === "object" && parsed !== null) obj = parsed as Record<string, unknown>;
    } catch {}
    if (obj === undefined) return `${raw}\n\n`;
    const type = typeof obj.type === "string" ? obj.type : event;
    if (type === "error" || (obj.error !== undefined && obj.error !== null && type !== "response.failed")) {
      this.error = normaliseEngineError(500, data);
      return responsesErrorEvent(this.error);
    }
    this.read(type, obj);
    return `${raw}\n\n`;
  }

  private read(type: string, obj: Record<string, unknown>): void {
    if (type.endsWith(".delta")) {
      this.dataEvents++;
      if (typeof obj.delta === "string" && obj.delta.length > 0) {
        this.relayed.chars += obj.delta.length;
        this.relayed.chunks++;
      }
      return;
    }
    if (type === "response.output_item.done") {
      // A reasoning item finishes before the answer begins: only an answer's own items count.
      const item = obj.item as { type?: unknown } | undefined;
      if (item?.type !== "reasoning") this.finished.add(0);
      return;
    }
    const response = obj.response as Record<string, unknown> | undefined;
    if (type === "response.completed" || type === "response.incomplete") {
      this.usage = readUsage(response?.usage);
      this.dataEvents++;
      this.done = true;
    } else if (type === "response.failed") {
      // What the engine did before it failed is still charged as it counted it.
      this.usage = readUsage(response?.usage);
      const failure = (response?.error ?? {}) as Record<string, unknown>;
      this.error = normaliseEngineError(500, JSON.stringify({ error: failure }));
    }
  }

  /** A Responses stream is complete at its terminal event, whatever its output items. */
  complete(): boolean {
    return this.done;
  }

  /** Nothing follows the terminal event: the Responses API has no `[DONE]`. */
  closing(): string {
    return "";
  }
}
