import type { UsageMode } from "../common/usage-mode.ts";
import { normaliseEngineError, type OpenAIErrorBody } from "./openai-errors.ts";

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
 */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export function readUsage(v: unknown): Usage | undefined {
  if (typeof v !== "object" || v === null) return undefined;
  const u = v as Record<string, unknown>;
  const p = u.prompt_tokens;
  const c = u.completion_tokens ?? 0;
  if (typeof p !== "number" || typeof c !== "number") return undefined;
  const t = typeof u.total_tokens === "number" ? u.total_tokens : p + c;
  return { prompt_tokens: p, completion_tokens: c, total_tokens: t };
}

/** Splits a byte stream's text into complete events; a partial event waits for its end. */
export class SseSplitter {
  private buf = "";

  push(text: string): string[] {
    this.buf += text.includes("\r") ? text.replace(/\r\n?/g, "\n") : text;
    const out: string[] = [];
    let at = 0;
    for (;;) {
      const end = this.buf.indexOf("\n\n", at);
      if (end < 0) break;
      if (end > at) out.push(this.buf.slice(at, end));
      at = end + 2;
    }
    this.buf = at === 0 ? this.buf : this.buf.slice(at);
    return out;
  }

  /** Bytes of an event that never finished (the engine stopped mid-event). */
  pending(): string {
    return this.buf;
  }

  /** Nothing is held back: the next chunk starts a new event. */
  get idle(): boolean {
    return this.buf === "";
  }
}

// The bytes the chunk fast path (StreamUsage.chunk) looks for.
const DATA_OBJECT = bytesOf("data: {");
const FIRST_CHOICE = bytesOf('"choices":[{"index":');
const USAGE_KEY = bytesOf(',"usage":');
const EMPTY_CHOICES = bytesOf('"choices":[]');
const NULL = bytesOf("null");
const NOTHING = new Uint8Array(0);

function bytesOf(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

function bytesAt(b: Uint8Array, at: number, what: Uint8Array): boolean {
  if (at < 0 || at + what.length > b.length) return false;
  for (let i = 0; i < what.length; i++) if (b[at + i] !== what[i]) return false;
  return true;
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

export class StreamUsage {
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

  constructor(private readonly mode: UsageMode) {}

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
    }
    if (!usageOnly) this.dataEvents++;
    if (this.mode === "continuous") return b;
    if (usageOnly) return this.mode === "final" ? b : NOTHING;
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
    const lines = raw.split("\n");
    const data: string[] = [];
    for (const l of lines) {
      if (l.startsWith("data:")) data.push(l.charCodeAt(5) === 32 ? l.slice(6) : l.slice(5));
    }
    if (data.length === 0) return `${raw}\n\n`; // comments, retry: hints
    const isError = lines.some((l) => l === "event: error" || l === "event:error");
    if (isError) {
      this.error = normaliseEngineError(500, data.join("\n"));
      return `data: ${JSON.stringify({ error: this.error })}\n\n`;
    }
    return this.data(data.join("\n"), raw);
  }

  private data(data: string, raw: string): string {
    if (data === "[DONE]") {
      this.done = true;
      return "data: [DONE]\n\n";
    }
    const fast = this.fastData(data, raw);
    if (fast !== undefined) return fast;
    let obj: Record<string, unknown>;
    try {
      obj = JSON.parse(data) as Record<string, unknown>;
    } catch {
      this.dataEvents++;
      return `${raw}\n\n`;
    }
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
    if (!usageOnly) this.dataEvents++;
    if (this.mode === "continuous" || !hasUsage) return `${raw}\n\n`;
    if (usageOnly) return this.mode === "final" ? `${raw}\n\n` : "";
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
    const at = data.lastIndexOf(',"usage":');
    if (at < 0) {
      if (data.includes('"usage"') || data.includes('"error"')) return undefined;
      this.dataEvents++;
      return `${raw}\n\n`;
    }
    const tail = data.slice(at + 9, -1);
    if (tail === "null") {
      this.dataEvents++;
      return this.mode === "continuous" ? `${raw}\n\n` : `data: ${data.slice(0, at)}}\n\n`;
    }
    if (tail.charCodeAt(0) !== 123 || data.charCodeAt(data.length - 1) !== 125) return undefined;
    const usageOnly = data.includes('"choices":[]');
    const choice = usageOnly ? -1 : choiceIndexText(data);
    if (!usageOnly && choice < 0) return undefined;
    this.record(choice, tail);
    if (!usageOnly) this.dataEvents++;
    if (this.mode === "continuous") return `${raw}\n\n`;
    if (usageOnly) return this.mode === "final" ? `${raw}\n\n` : "";
    return `data: ${data.slice(0, at)}}\n\n`;
  }
}
