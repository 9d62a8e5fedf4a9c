import { eventFields } from "../../common/sse.ts";
import type { UsageMode } from "../../common/usage-mode.ts";
import { normaliseEngineError, type OpenAIErrorBody } from "../openai-errors.ts";

/**
 * Server-sent events from an engine, split into whole events and read for
 * token usage. Pure, so the proxy, tests and benchmarks share it.
 *
 * The proxy asks engines for `stream_options.include_usage` and vLLM's
 * `continuous_usage_stats`, so every chunk carries the cumulative usage so
 * far: whatever point a stream stops at, the last chunk read says exactly
 * what was generated up to it. With `n > 1` vLLM counts each chunk's own
 * choice only (`completion_tokens` of that choice), so the usage so far is
 * the sum over choices of each one's latest count, until the final
 * `choices: []` chunk gives the total. What the client sees is cut back to
 * what it asked for.
 *
 * Engines other than vLLM send less: usage on the finish chunk only, or
 * none at all, and streams that end without `[DONE]`. So the tracker also
 * records which choices have finished (a stream is complete when each has,
 * docs/engines.md) and, while no usage has come, how much answer text went
 * by, for an estimate. The engine's `[DONE]` is dropped: the proxy ends
 * every complete stream with its own, after the one final usage chunk the
 * client asked for (the engine's, or one made here when it sent none).
 */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** Usage in chat's names, or the Responses API's (`input_tokens`, `output_tokens`). */
export function readUsage(v: unknown): Usage | undefined {
  if (typeof v !== "object" || v === null) return undefined;
  const u = v as Record<string, unknown>;
  const p = u.prompt_tokens ?? u.input_tokens;
  const c = u.completion_tokens ?? u.output_tokens ?? 0;
  if (typeof p !== "number" || typeof c !== "number") return undefined;
  const t = typeof u.total_tokens === "number" ? u.total_tokens : p + c;
  return { prompt_tokens: p, completion_tokens: c, total_tokens: t };
}

/** Answer text relayed while no usage had come, for an estimate (usage-estimate.ts). */
export interface Relayed {
  /** Characters of answer text (content, reasoning, tool-call names and arguments). */
  chars: number;
  /** Chunks that carried any. */
  chunks: number;
}

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
}

// The bytes the chunk fast path (StreamUsage.chunk) looks for.
const DATA_OBJECT = bytesOf("data: {");
const FIRST_CHOICE = bytesOf('"choices":[{"index":');
const USAGE_KEY = bytesOf(',"usage":');
const EMPTY_CHOICES = bytesOf('"choices":[]');
const NULL = bytesOf("null");
const FINISHED = bytesOf('"finish_reason":"');
const FINISHED_TEXT = '"finish_reason":"';
const NOTHING = new Uint8Array(0);

function bytesOf(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

function bytesAt(b: Uint8Array, at: number, what: Uint8Array): boolean {
  if (at < 0 || at + what.length > b.length) return false;
  for (let i = 0; i < what.length; i++) if (b[at + i] !== what[i]) return false;
  return true;
}

/** Whether `what` occurs in `b` from `from` on (anchored on its second byte, rarer than a quote). */
function hasBytes(b: Uint8Array, what: Uint8Array, from: number): boolean {
  for (let p = b.indexOf(what[1]!, from + 1); p > 0; p = b.indexOf(what[1]!, p + 1)) {
    if (bytesAt(b, p - 1, what)) return true;
  }
  return false;
}

/** Characters of answer in one choice (a chunk's or a whole answer's): text, reasoning, tool-call names and arguments. */
export function answerChars(choice: Record<string, unknown>): number {
  const delta = (choice.delta ?? choice.message) as Record<string, unknown> | undefined;
  let n = typeof choice.text === "string" ? choice.text.length : 0;
  if (typeof delta !== "object" || delta === null) return n;
  if (typeof delta.content === "string") n += delta.content.length;
  if (typeof delta.reasoning_content === "string") n += delta.reasoning_content.length;
  if (Array.isArray(delta.tool_calls)) {
    for (const call of delta.tool_calls as { function?: { name?: unknown; arguments?: unknown } }[]) {
      if (typeof call?.function?.name === "string") n += call.function.name.length;
      if (typeof call?.function?.arguments === "string") n += call.function.arguments.length;
    }
  }
  return n;
}

function choiceIndexText(data: string): number {
  const at = data.indexOf('"choices":[{"index":');
  if (at < 0) return -1;
  const m = /^\d{1,7}/.exec(data.slice(at + 20, at + 28));
  return m ? Number(m[0]) : -1;
}

/** One source of usage: a choice's latest chunk, or the final total. Parsed when asked for. */
interface UsageSlot {
  text: string | undefined;
  parsed: Usage | undefined;
}

function settle(slot: UsageSlot | undefined): Usage | undefined {
  if (slot === undefined) return undefined;
  if (slot.text !== undefined) {
    try {
      const u = readUsage(JSON.parse(slot.text));
      if (u) slot.parsed = u;
    } catch {
      // A malformed usage tail: keep the last one that was parsed.
    }
    slot.text = undefined;
  }
  return slot.parsed;
}

const DONE = "data: [DONE]\n\n";

export class StreamUsage implements StreamTracker {
  // The usage object of each choice's latest chunk, as text: with usage on
  // every chunk only the last one matters, so it is parsed when asked for, once.
  private readonly choices = new Map<number, UsageSlot>();
  /** The final `choices: []` chunk's usage: the request's total. */
  private readonly total: UsageSlot = { text: undefined, parsed: undefined };
  private readonly decoder = new TextDecoder();
  /** Where the last chunk's choice index was (choiceIndex). */
  private choiceAt = 0;
  /** `data: [DONE]` seen: the engine finished the stream normally. */
  done = false;
  /** An error event from the engine (already normalised). */
  error: OpenAIErrorBody | undefined;
  /** Data events other than [DONE] and errors (first one = first token). */
  dataEvents = 0;
  /** The choices whose `finish_reason` has come. */
  readonly finished = new Set<number>();
  /** Answer text relayed while no usage had come: characters, and the chunks that carried any. */
  readonly relayed = { chars: 0, chunks: 0 };
  /** The first data event, whose id, object, created and model a made-up usage chunk repeats. */
  private first: string | undefined;
  /** The client has had its final `choices: []` usage chunk. */
  private usageSent = false;
  private usageSeen = false;

  constructor(private readonly mode: UsageMode) {}

  /** Every choice has finished (or the engine said `[DONE]`): what was asked for is all there. */
  complete(choices: number): boolean {
    return this.done || this.finished.size >= choices;
  }

  /**
   * The one final usage chunk a client that asked for usage gets, when the
   * engine sent none of its own ("" otherwise, and after the first).
   */
  finalUsageEvent(usage: Usage | undefined): string {
    if (usage === undefined || !this.takeUsageChunk()) return "";
    let head: Record<string, unknown> = {};
    try {
      head = JSON.parse(this.first ?? "{}") as Record<string, unknown>;
    } catch {
      // A first event that was not JSON: the chunk goes without its id.
    }
    const { id, object, created, model } = head;
    return `data: ${JSON.stringify({ id, object, created, model, choices: [], usage })}\n\n`;
  }

  /** The final usage chunk if it is still owed, then the stream's own `[DONE]`. */
  closing(usage: Usage | undefined): string {
    return this.finalUsageEvent(usage) + DONE;
  }

  /** Whether an engine's `choices: []` usage chunk goes to the client: once, when it asked for usage. */
  private takeUsageChunk(): boolean {
    if (this.mode === "none" || this.usageSent) return false;
    this.usageSent = true;
    return true;
  }

  private dataEvent(data: () => string): void {
    if (this.dataEvents === 0) this.first = data();
    this.dataEvents++;
  }

  /** What a parsed chunk says beyond usage: finished choices, and answer text while estimating. */
  private inspect(obj: Record<string, unknown>): void {
    const choices = obj.choices;
    if (!Array.isArray(choices)) return;
    let chars = 0;
    for (const c of choices as Record<string, unknown>[]) {
      if (typeof c !== "object" || c === null) continue;
      if (typeof c.finish_reason === "string") this.finished.add(typeof c.index === "number" ? c.index : 0);
      if (!this.usageSeen) chars += answerChars(c);
    }
    if (chars > 0) {
      this.relayed.chars += chars;
      this.relayed.chunks++;
    }
  }

  /** Usage so far: the final total once seen, else the sum over choices of each one's latest. */
  get usage(): Usage | undefined {
    const total = settle(this.total);
    if (total) return total;
    let sum: Usage | undefined;
    for (const slot of this.choices.values()) {
      const u = settle(slot);
      if (!u) continue;
      const completion = (sum?.completion_tokens ?? 0) + u.completion_tokens;
      sum = {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: completion,
        total_tokens: u.prompt_tokens + completion,
      };
    }
    return sum;
  }

  /** Records a chunk's usage: `choice` is its choice's index, -1 for the final total. */
  private record(choice: number, text: string | undefined, parsed?: Usage): void {
    let slot = choice < 0 ? this.total : this.choices.get(choice);
    if (slot === undefined) {
      slot = { text: undefined, parsed: undefined };
      this.choices.set(choice, slot);
    }
    slot.text = text;
    if (parsed) slot.parsed = parsed;
    this.usageSeen = true;
  }

  /**
   * The common chunk without text at all: exactly one `data: {...}` event
   * in vLLM's layout (`..."choices":[...],"usage":...}`), read and cut as
   * bytes. Returns what to forward (the chunk itself, a prefix of it with
   * the usage cut off, or nothing), or undefined for anything else, which
   * the caller then passes through SseSplitter and event() as text. Only
   * for a chunk that starts a new event (SseSplitter.idle). The chunk's
   * bytes may be rewritten in place: the caller owns it and must not use
   * it again. For chunks in that layout, what it returns and the usage it
   * records are what event() would have made of the same text.
   */
  chunk(b: Uint8Array): Uint8Array | undefined {
    const n = b.length;
    // One line, one event: its only line feeds are the two that end it.
    if (n < 16 || b[n - 1] !== 10 || b[n - 2] !== 10 || b[n - 3] !== 125 /* } */) return undefined;
    if (!bytesAt(b, 0, DATA_OBJECT) || b.indexOf(10) !== n - 2) return undefined;
    // A finish chunk (one per choice) is read whole, on the text path.
    if (hasBytes(b, FINISHED, DATA_OBJECT.length)) return undefined;
    // The usage object is the last key: its key is the last `,"usage":`,
    // found by hopping back from comma to comma.
    let at = n - 3 - USAGE_KEY.length;
    for (;;) {
      at = b.lastIndexOf(44 /* , */, at);
      if (at <= DATA_OBJECT.length) return undefined;
      if (bytesAt(b, at, USAGE_KEY)) break;
      at--;
    }
    const usageOnly = bytesAt(b, at - EMPTY_CHOICES.length, EMPTY_CHOICES);
    // Else a content chunk whose choices array ends right before usage.
    if (!usageOnly && (b[at - 1] !== 93 /* ] */ || b[at - 2] !== 125)) return undefined;
    const tail = at + USAGE_KEY.length;
    const isNull = tail + NULL.length === n - 3 && bytesAt(b, tail, NULL);
    if (!isNull) {
      if (b[tail] !== 123 /* { */) return undefined;
      const choice = usageOnly ? -1 : this.choiceIndex(b, at);
      if (!usageOnly && choice < 0) return undefined;
      this.record(choice, this.decoder.decode(b.subarray(tail, n - 3)));
    } else if (usageOnly) {
      return undefined; // `"choices":[],"usage":null`: not a usage chunk; the general path decides
    } else if (!this.usageSeen) {
      return undefined; // no usage yet: the text path counts the answer for an estimate
    }
    if (usageOnly) return this.takeUsageChunk() ? b : NOTHING;
    this.dataEvent(() => this.decoder.decode(b.subarray(DATA_OBJECT.length - 1, n - 2)));
    if (this.mode === "continuous") return b;
    // `,"usage":{...}}\n\n` becomes `}\n\n`, in place.
    b[at] = 125;
    b[at + 1] = 10;
    b[at + 2] = 10;
    return b.subarray(0, at + 3);
  }

  /**
   * The choice index in vLLM's layout (`"choices":[{"index":N`) before byte
   * `end`, or -1. The key sits at the same offset in every chunk of a stream
   * (id, object, created and model do not change), so that is tried first.
   */
  private choiceIndex(b: Uint8Array, end: number): number {
    if (!bytesAt(b, this.choiceAt, FIRST_CHOICE)) {
      const bracket = FIRST_CHOICE.indexOf(91 /* [ */);
      let p = DATA_OBJECT.length;
      while (p < end && !(b[p] === 91 && bytesAt(b, p - bracket, FIRST_CHOICE))) p++;
      if (p >= end) return -1;
      this.choiceAt = p - bracket;
    }
    let i = this.choiceAt + FIRST_CHOICE.length;
    const start = i;
    let n = 0;
    for (; i < end && i - start < 8 && b[i]! >= 48 && b[i]! <= 57; i++) n = n * 10 + b[i]! - 48;
    return i > start ? n : -1;
  }

  /** One event (without its blank line); returns what to forward, "" to drop it. */
  event(raw: string): string {
    if (!raw.startsWith("data:") || raw.includes("\ndata:") || raw.includes("\n")) {
      return this.complexEvent(raw);
    }
    const data = raw.charCodeAt(5) === 32 ? raw.slice(6) : raw.slice(5);
    return this.data(data, raw);
  }

  private complexEvent(raw: string): string {
    const { event, data } = eventFields(raw);
    if (data === undefined) return `${raw}\n\n`; // comments, retry: hints
    if (event === "error") {
      this.error = normaliseEngineError(500, data);
      return `data: ${JSON.stringify({ error: this.error })}\n\n`;
    }
    return this.data(data, raw);
  }

  private data(data: string, raw: string): string {
    if (data === "[DONE]") {
      this.done = true;
      return "";
    }
    const fast = this.fastData(data, raw);
    if (fast !== undefined) return fast;
    let parsed: unknown;
    try {
      parsed = JSON.parse(data);
    } catch {}
    // Not JSON, or JSON but no object (`data: null`): relayed as it came.
    if (typeof parsed !== "object" || parsed === null) {
      this.dataEvent(() => data);
      return `${raw}\n\n`;
    }
    const obj = parsed as Record<string, unknown>;
    if (obj.error !== undefined && obj.error !== null) {
      const e = obj.error as Record<string, unknown>;
      const status = typeof e.code === "number" && e.code >= 400 ? e.code : 500;
      this.error = normaliseEngineError(status, data);
      return `data: ${JSON.stringify({ error: this.error })}\n\n`;
    }
    const hasUsage = obj.usage !== undefined && obj.usage !== null;
    const choices = obj.choices;
    const usageOnly = Array.isArray(choices) && choices.length === 0 && hasUsage;
    if (hasUsage) {
      const u = readUsage(obj.usage);
      const index = Array.isArray(choices)
        ? (choices[0] as { index?: unknown } | undefined)?.index
        : undefined;
      if (u) this.record(usageOnly ? -1 : typeof index === "number" ? index : 0, undefined, u);
    }
    if (usageOnly) return this.takeUsageChunk() ? `${raw}\n\n` : "";
    this.inspect(obj);
    this.dataEvent(() => data);
    if (this.mode === "continuous" || !hasUsage) return `${raw}\n\n`;
    // A content chunk with usage the client did not ask for on every chunk.
    delete obj.usage;
    return `data: ${JSON.stringify(obj)}\n\n`;
  }

  /**
   * The common case without a full JSON round trip per chunk: vLLM (and the
   * sim) serialise compactly with `usage` as the last key, so the usage
   * object is the tail of the chunk and can be read and cut off as a
   * substring. Anything else (errors, other layouts) returns undefined and
   * takes the general path.
   */
  private fastData(data: string, raw: string): string | undefined {
    if (data.charCodeAt(0) !== 123 /* { */ || data.startsWith('{"error"')) return undefined;
    // Finish chunks, and every chunk while no usage has come, are parsed:
    // the one for which choice finished, the other for an estimate.
    const inspect = data.includes(FINISHED_TEXT) || !this.usageSeen;
    const at = data.lastIndexOf(',"usage":');
    if (at < 0) {
      if (inspect || data.includes('"usage"') || data.includes('"error"')) return undefined;
      this.dataEvent(() => data);
      return `${raw}\n\n`;
    }
    const tail = data.slice(at + 9, -1);
    if (tail === "null") {
      if (inspect && !this.inspectText(data)) return undefined;
      this.dataEvent(() => data);
      return this.mode === "continuous" ? `${raw}\n\n` : `data: ${data.slice(0, at)}}\n\n`;
    }
    if (tail.charCodeAt(0) !== 123 || data.charCodeAt(data.length - 1) !== 125) return undefined;
    const usageOnly = data.includes('"choices":[]');
    const choice = usageOnly ? -1 : choiceIndexText(data);
    if (!usageOnly && choice < 0) return undefined;
    this.record(choice, tail);
    if (usageOnly) return this.takeUsageChunk() ? `${raw}\n\n` : "";
    if (inspect && !this.inspectText(data)) return undefined;
    this.dataEvent(() => data);
    if (this.mode === "continuous") return `${raw}\n\n`;
    return `data: ${data.slice(0, at)}}\n\n`;
  }

  /** inspect() on a chunk's text; false if it is not JSON after all. */
  private inspectText(data: string): boolean {
    try {
      this.inspect(JSON.parse(data) as Record<string, unknown>);
      return true;
    } catch {
      return false;
    }
  }
}
