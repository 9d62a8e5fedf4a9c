import { describe, expect, it } from "vitest";
import { ApiError } from "./openai-errors.ts";
import { completionRequest, readBodyLimited, responsesRequest, validate } from "./request-schema.ts";

const LIMIT = 1000;

/** A request whose body is `chunks` chunks of 100 bytes, counting how many the reader pulled and whether it cancelled. */
function upload(chunks: number, declared: boolean) {
  const seen = { pulled: 0, cancelled: false };
  const body = new ReadableStream<Uint8Array>({
    pull(ctrl) {
      if (seen.pulled === chunks) return ctrl.close();
      seen.pulled++;
      ctrl.enqueue(new Uint8Array(100));
    },
    cancel() {
      seen.cancelled = true;
    },
  });
  const headers = declared ? { "content-length": String(chunks * 100) } : undefined;
  const req = new Request("http://edge/v1/chat/completions", {
    method: "POST",
    body,
    headers,
    duplex: "half",
  } as RequestInit);
  return { req, seen };
}

describe("readBodyLimited on an oversized body", () => {
  it.each([
    // Read to its end before the 413, so the client is not reset while it still sends.
    {
      name: "declared, up to twice the limit: drained",
      chunks: 15,
      declared: true,
      pulled: 15,
      cancelled: false,
    },
    {
      name: "chunked, up to twice the limit: drained",
      chunks: 18,
      declared: false,
      pulled: 18,
      cancelled: false,
    },
    {
      name: "chunked, past twice the limit: cut off after the chunk that crosses it",
      chunks: 50,
      declared: false,
      pulled: 21,
      cancelled: true,
    },
  ])("$name", async ({ chunks, declared, pulled, cancelled }) => {
    const { req, seen } = upload(chunks, declared);
    const err = await readBodyLimited(req, LIMIT).catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(413);
    expect(seen.pulled).toBe(pulled);
    expect(seen.cancelled).toBe(cancelled);
  });

  it("declared past twice the limit: refused without reading it", async () => {
    const { req, seen } = upload(25, true);
    const err = await readBodyLimited(req, LIMIT).catch((e) => e);
    expect((err as ApiError).status).toBe(413);
    // At most the one chunk a stream pulls ahead as it is made.
    expect(seen.pulled).toBeLessThanOrEqual(1);
  });
});

describe("validate", () => {
  const message = (f: () => unknown) => {
    try {
      f();
    } catch (err) {
      return err instanceof ApiError ? [err.status, err.body().message, err.body().param] : err;
    }
    return "accepted";
  };

  it("says a missing field is required, a union's (input, prompt) too, and names a present one's fault", () => {
    expect(message(() => validate(responsesRequest, { model: "m" }))).toEqual([
      400,
      "input: is required",
      "input",
    ]);
    expect(message(() => validate(completionRequest, { model: "m" }))).toEqual([
      400,
      "prompt: is required",
      "prompt",
    ]);
    expect(message(() => validate(responsesRequest, { model: "m", input: 3 }))).toEqual([
      400,
      "input: Invalid input",
      "input",
    ]);
    expect(message(() => validate(responsesRequest, { model: "m", input: [] }))).toEqual([
      400,
      "input: must contain at least one item",
      "input",
    ]);
    expect(
      message(() => validate(responsesRequest, { model: "m", input: "hi", max_output_tokens: 0 })),
    ).toEqual([400, "max_output_tokens: must be at least 1, got 0", "max_output_tokens"]);
    // A nested field that is there but wrong is its fault, not a missing field.
    expect(
      message(() =>
        validate(completionRequest, { model: "m", prompt: "p", stream_options: { include_usage: "y" } }),
      ),
    ).toEqual([
      400,
      "stream_options.include_usage: Invalid input: expected boolean, received string",
      "stream_options.include_usage",
    ]);
    const reasoning = { type: "reasoning", content: null, summary: [] };
    expect(message(() => validate(responsesRequest, { model: "m", input: [reasoning] }))).toBe("accepted");
  });
});
