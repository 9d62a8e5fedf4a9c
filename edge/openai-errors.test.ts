import { describe, expect, it } from "vitest";
import { normaliseEngineError, typeForStatus } from "./openai-errors.ts";

describe("engine errors", () => {
  it("normalises vLLM, flat and text errors into OpenAI's four fields", () => {
    expect(
      normaliseEngineError(
        400,
        '{"error":{"message":"bad","type":"BadRequestError","param":"max_tokens","code":400}}',
      ),
    ).toEqual({ message: "bad", type: "invalid_request_error", param: "max_tokens", code: null });
    expect(
      normaliseEngineError(404, '{"object":"error","message":"no model","type":"NotFoundError","code":404}'),
    ).toEqual({
      message: "no model",
      type: "invalid_request_error",
      param: null,
      code: null,
    });
    expect(normaliseEngineError(502, "<html>bad gateway</html>")).toMatchObject({
      type: "server_error",
      code: null,
    });
    expect(normaliseEngineError(429, '{"error":{"message":"slow","code":"rate_limit_exceeded"}}').code).toBe(
      "rate_limit_exceeded",
    );
  });
});

describe("engine errors in other servers' shapes", () => {
  it.each([
    [
      "OpenAI's",
      400,
      '{"error":{"message":"bad max_tokens","type":"invalid_request_error"}}',
      "bad max_tokens",
      null,
    ],
    ["FastAPI's detail string", 404, '{"detail":"Not Found"}', "Not Found", null],
    [
      "FastAPI's validation list",
      422,
      '{"detail":[{"loc":["body","messages",0,"role"],"msg":"field required","type":"value_error.missing"},{"loc":["body","temperature"],"msg":"must be <= 2","type":"x"}]}',
      "body.messages.0.role: field required; body.temperature: must be <= 2",
      "messages.0.role",
    ],
    ["a JSON string", 500, '"model crashed"', "model crashed", null],
    [
      "an HTML page",
      502,
      "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title><style>b{}</style></head><body><h1>Bad Gateway</h1></body></html>",
      "502 Bad Gateway",
      null,
    ],
    [
      "an HTML page without a title",
      503,
      "<html><body><h1>Service\n  Unavailable</h1></body></html>",
      "Service Unavailable",
      null,
    ],
    ["plain text", 500, "Internal Server Error\n", "Internal Server Error", null],
    ["nothing", 503, "", "engine returned HTTP 503", null],
  ])("%s", (_name, status, text, message, param) => {
    expect(normaliseEngineError(status, text)).toEqual({
      message,
      type: typeForStatus(status),
      param,
      code: null,
    });
  });

  it("keeps a long message readable: cut at 500 characters", () => {
    expect(normaliseEngineError(500, "x".repeat(2000)).message).toHaveLength(500);
  });
});
