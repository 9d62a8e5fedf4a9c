import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { eventFields, SseSplitter } from "./sse.ts";

function eventsOf(pieces: readonly string[]): string[] {
  const s = new SseSplitter();
  const out: string[] = [];
  for (const p of pieces) out.push(...s.push(p));
  out.push(...s.end());
  return out;
}

/** Cuts `text` at the given offsets (any order, repeats allowed). */
function cut(text: string, at: readonly number[]): string[] {
  const points = [...new Set(at.map((a) => a % (text.length + 1)))].sort((a, b) => a - b);
  const pieces: string[] = [];
  let from = 0;
  for (const p of points) {
    pieces.push(text.slice(from, p));
    from = p;
  }
  pieces.push(text.slice(from));
  return pieces;
}

const lineEnd = fc.constantFrom("\n", "\r", "\r\n");
const line = fc.oneof(
  fc.string({ unit: fc.constantFrom("a", "b", ":", " ", "{", "}") }).map((s) => `data: ${s}`),
  fc.constant("event: error"),
  fc.constant(": keep-alive"),
);
const event = fc
  .tuple(fc.array(fc.tuple(line, lineEnd), { minLength: 1, maxLength: 4 }), lineEnd)
  .map(([lines, blank]) => lines.map(([l, e]) => l + e).join("") + blank);
const stream = fc.array(event, { maxLength: 6 }).map((es) => es.join(""));

describe("SseSplitter", () => {
  it("gives the same events for any split of any stream, whatever its line ends", () => {
    fc.assert(
      fc.property(stream, fc.array(fc.nat(), { maxLength: 12 }), (text, at) => {
        expect(eventsOf(cut(text, at))).toEqual(eventsOf([text]));
      }),
      { numRuns: 500 },
    );
  });

  it("keeps a CRLF split across two writes one line end, so a multi-line event stays one event", () => {
    expect(eventsOf(["event: error\r", '\ndata: {"x":1}\r\n\r\n'])).toEqual(['event: error\ndata: {"x":1}']);
    expect(eventsOf(["data: a\r", "\ndata: b\r\n\r\n"])).toEqual(["data: a\ndata: b"]);
  });

  it("ends an event on a lone CR at the very end of the stream", () => {
    expect(eventsOf(["data: a\r\r"])).toEqual(["data: a"]);
  });

  it("holds an unfinished event as pending, not as an event", () => {
    const s = new SseSplitter();
    expect(s.push("data: a\n\ndata: b")).toEqual(["data: a"]);
    expect(s.pending()).toBe("data: b");
    expect(s.idle).toBe(false);
  });
});

describe("eventFields", () => {
  it.each([
    ["data: x", { event: "", data: "x" }],
    ["data:x", { event: "", data: "x" }],
    ["event: error\ndata: {}", { event: "error", data: "{}" }],
    ["data: a\ndata: b", { event: "", data: "a\nb" }],
    [": comment", { event: "", data: undefined }],
    ["retry: 10", { event: "", data: undefined }],
    ["data", { event: "", data: "" }],
  ])("%j", (raw, fields) => {
    expect(eventFields(raw)).toEqual(fields);
  });
});
