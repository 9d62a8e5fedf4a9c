/**
 * Server-sent events as text: a splitter that turns a stream's pieces into
 * whole events, and the fields of one event. One reading of the format for
 * the edge (engine streams), the load generator and tests (edge streams).
 * Pure, no runtime APIs: the edge bundles it.
 *
 * Lines may end in LF, CRLF or a lone CR. A CR at the very end of a piece
 * may be the first half of a CRLF whose LF comes in the next piece, so it is
 * held back until that piece shows which: reading CRs piece by piece would
 * turn one CRLF split across two writes into two line ends, and cut a
 * multi-line event (`event: error` + `data: …`) in two.
 */
export class SseSplitter {
  private buf = "";
  /** A CR that ended the last piece, not yet known to be a CRLF's first half. */
  private cr = false;

  /** The events completed by this piece, each without its blank line. */
  push(text: string): string[] {
    let t = this.cr ? `\r${text}` : text;
    this.cr = false;
    if (t.includes("\r")) {
      if (t.endsWith("\r")) {
        this.cr = true;
        t = t.slice(0, -1);
      }
      t = t.replace(/\r\n?/g, "\n");
    }
    this.buf += t;
    return this.take();
  }

  /** At the end of the stream: a held CR was a line end after all. */
  end(): string[] {
    if (!this.cr) return [];
    this.cr = false;
    this.buf += "\n";
    return this.take();
  }

  private take(): string[] {
    const out: string[] = [];
    let at = 0;
    for (;;) {
      const end = this.buf.indexOf("\n\n", at);
      if (end < 0) break;
      if (end > at) out.push(this.buf.slice(at, end));
      at = end + 2;
    }
    if (at > 0) this.buf = this.buf.slice(at);
    return out;
  }

  /** Text of an event that never finished (the stream stopped mid-event). */
  pending(): string {
    return this.cr ? `${this.buf}\r` : this.buf;
  }

  /** Nothing is held back: the next piece starts a new event. */
  get idle(): boolean {
    return this.buf === "" && !this.cr;
  }
}

export interface SseEvent {
  /** The `event:` field, "" when absent (a plain message). */
  event: string;
  /** The `data:` lines joined with LF; undefined when the event has none (a comment, a retry hint). */
  data: string | undefined;
}

/** The fields of one event as SseSplitter gives it. */
export function eventFields(raw: string): SseEvent {
  let event = "";
  let data: string | undefined;
  for (const line of raw.split("\n")) {
    const colon = line.indexOf(":");
    if (colon === 0) continue; // a comment
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(line.charCodeAt(colon + 1) === 32 ? colon + 2 : colon + 1);
    if (name === "data") data = data === undefined ? value : `${data}\n${value}`;
    else if (name === "event") event = value;
  }
  return { event, data };
}
