import { describe, expect, it } from "vitest";
import { SseSplitter } from "../../common/sse.ts";
import { usageModeOf } from "../../common/usage-mode.ts";
import { chatChunks, contentDelta, usageJson } from "../../sim-engine/protocol.ts";
import { StreamUsage } from "./sse-usage.ts";

describe("SSE usage", () => {
  const chunk = (n: number, usage = true) =>
    `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "x" } }], ...(usage ? { usage: { prompt_tokens: 5, completion_tokens: n, total_tokens: 5 + n } } : {}) })}`;
  const final = `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } })}`;

  it("splits events across arbitrary chunk boundaries, CRLF included", () => {
    const s = new SseSplitter();
    const text = `${chunk(1)}\r\n\r\n${chunk(2)}\n\ndata: [DONE]\n\n`;
    const events: string[] = [];
    for (let i = 0; i < text.length; i += 7) events.push(...s.push(text.slice(i, i + 7)));
    expect(events).toHaveLength(3);
    expect(events[2]).toBe("data: [DONE]");
    expect(s.pending()).toBe("");
  });

  it("tracks the last cumulative usage and strips what the client did not ask for", () => {
    const none = new StreamUsage("none");
    expect(none.event(chunk(1))).not.toContain("usage");
    expect(none.event(final)).toBe("");
    // The proxy writes its own [DONE] once the stream is complete.
    expect(none.event("data: [DONE]")).toBe("");
    expect(none.usage).toEqual({ prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 });
    expect(none.done).toBe(true);
    expect(none.dataEvents).toBe(1);

    const fin = new StreamUsage("final");
    expect(fin.event(chunk(1))).not.toContain("usage");
    expect(fin.event(final)).toContain('"usage"');

    const all = new StreamUsage("continuous");
    expect(all.event(chunk(1))).toBe(`${chunk(1)}\n\n`);
  });

  it("keeps the last usage that parses when a later usage tail is malformed", () => {
    const t = new StreamUsage("none");
    t.event(chunk(3));
    expect(t.usage?.completion_tokens).toBe(3);
    const broken = chunk(4).replace('"completion_tokens":4', '"completion_tokens":4,,');
    expect(t.event(broken)).not.toContain("usage");
    expect(t.usage?.completion_tokens).toBe(3);
    t.event(chunk(5));
    expect(t.usage?.completion_tokens).toBe(5);
  });

  it("normalises an engine's error event (vLLM int code)", () => {
    const t = new StreamUsage("none");
    const out = t.event(
      'data: {"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}',
    );
    expect(JSON.parse(out.slice(6)).error).toEqual({
      message: "boom",
      type: "server_error",
      param: null,
      code: null,
    });
    expect(t.error?.message).toBe("boom");
  });

  it("derives the usage mode from stream_options", () => {
    expect(usageModeOf(undefined)).toBe("none");
    expect(usageModeOf({ include_usage: true })).toBe("final");
    expect(usageModeOf({ include_usage: true, continuous_usage_stats: true })).toBe("continuous");
    expect(usageModeOf({ continuous_usage_stats: true })).toBe("none");
  });
});

describe("SSE fast path", () => {
  // The substring fast path must give exactly what the JSON round trip gives.
  const chunks = [
    '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0}}',
    '{"id":"c","choices":[{"index":0,"delta":{"content":" \\"usage\\": {}"}}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}',
    '{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}',
    '{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}}',
    '{"id":"c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}',
    '{"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}',
  ];
  it.each(["none", "final", "continuous"] as const)("matches the general path in mode %s", (mode) => {
    const t = new StreamUsage(mode);
    let usageChunks = 0;
    for (const c of chunks) {
      const out = t.event(`data: ${c}`);
      const obj = JSON.parse(c);
      const usageOnly = Array.isArray(obj.choices) && obj.choices.length === 0 && obj.usage;
      // Only the first usage chunk goes to a client that asked for usage.
      if (usageOnly) expect(out).toBe(mode !== "none" && usageChunks++ === 0 ? `data: ${c}\n\n` : "");
      else if (mode === "continuous") expect(out).toBe(`data: ${c}\n\n`);
      else {
        delete obj.usage;
        expect(JSON.parse(out.slice(6))).toEqual(obj);
      }
    }
    expect(t.usage).toEqual({ prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 });
    expect(t.dataEvents).toBe(4);
  });
});

describe("SSE chunk fast path (bytes)", () => {
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  // What the sim (and vLLM) writes for one chat stream with continuous usage.
  const w = chatChunks("chatcmpl-1", 1, "m", "continuous");
  const u = (c: number, details = false) => usageJson({ prompt: 9, completion: c, cached: 4 }, details);
  const role = w.role(0, u(0));
  const first = w.token(0, contentDelta("Hé"), null, null, u(1));
  const engine = [
    role,
    first,
    w.token(0, contentDelta(' "usage":{}'), null, null, u(2)), // the key's text inside content, escaped
    w.token(0, contentDelta("x"), null, null, null), // usage null
    w.token(0, contentDelta("ü"), null, "stop", u(3, true)), // nested prompt_tokens_details
    w.usage(u(3, true)),
  ];

  it.each(["none", "final", "continuous"] as const)("gives what the text path gives, mode %s", (mode) => {
    const bytes = new StreamUsage(mode);
    const text = new StreamUsage(mode);
    for (const c of engine) {
      const want = text.event(c.slice(0, -2));
      // A finish chunk is read whole, on the text path.
      const got = bytes.chunk(enc.encode(c)) ?? enc.encode(bytes.event(c.slice(0, -2)));
      expect(dec.decode(got)).toBe(want);
    }
    expect([...bytes.finished]).toEqual([0]);
    expect(bytes.usage).toEqual(text.usage);
    expect(bytes.usage).toEqual({ prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 });
    expect(bytes.dataEvents).toBe(text.dataEvents);
    expect(bytes.dataEvents).toBe(5);
  });

  it.each([
    ["two events in one chunk", `${role}${first}`],
    ["an event cut short", first.slice(0, -1)],
    ["CRLF line ends", first.replace("\n\n", "\r\n\r\n")],
    ["no usage key", 'data: {"choices":[{"index":0}]}\n\n'],
    ["usage not last after choices", 'data: {"choices":[{"index":0}],"x":1,"usage":{"prompt_tokens":1}}\n\n'],
    ["usage not an object", 'data: {"choices":[{"index":0}],"usage":7}\n\n'],
    ["empty choices, null usage", 'data: {"choices":[],"usage":null}\n\n'],
    ["[DONE]", "data: [DONE]\n\n"],
    ["an error event", 'data: {"error":{"message":"boom","code":500}}\n\n'],
    ["no space after data:", first.replace("data: ", "data:")],
  ])("leaves %s to the text path", (_name, c) => {
    const t = new StreamUsage("none");
    expect(t.chunk(enc.encode(c))).toBeUndefined();
    expect(t.dataEvents).toBe(0);
    expect(t.usage).toBeUndefined();
  });

  it("cuts the usage off in place, leaving one event", () => {
    const b = enc.encode(first);
    const out = new StreamUsage("none").chunk(b)!;
    expect(out.buffer).toBe(b.buffer);
    expect(dec.decode(out)).toMatch(/^data: \{.*"finish_reason":null\}\]\}\n\n$/);
  });
});
