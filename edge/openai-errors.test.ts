import { describe, expect, it } from "vitest";
import { normaliseEngineError } from "./openai-errors.ts";

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
