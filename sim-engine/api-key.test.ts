import { describe, expect, it } from "vitest";
import { Secrets, sglangAuthorized, sglangSecrets, UNAUTHORIZED_BODY, vllmAuthorized } from "./api-key.ts";

describe("Secrets", () => {
  it("holds exactly the secrets it was given, compared whole", () => {
    const s = new Secrets(["sk-one", "sk-two"]);
    expect(s.size).toBe(2);
    expect(s.has("sk-one")).toBe(true);
    expect(s.has("sk-two")).toBe(true);
    for (const other of ["", "sk-on", "sk-one ", "SK-ONE", "sk-onesk-two"]) expect(s.has(other)).toBe(false);
    expect(new Secrets([]).has("")).toBe(false);
  });

  it("refuses with vLLM's and SGLang's body, byte for byte", () => {
    expect(UNAUTHORIZED_BODY).toBe(JSON.stringify({ error: "Unauthorized" }));
  });
});

describe("vLLM's rule", () => {
  const keys = new Secrets(["sk-a", "sk-b"]);
  const chat = (authorization: string | undefined, method = "POST") =>
    vllmAuthorized(keys, "/v1/chat/completions", method, authorization);

  it("lets a /v1 request through with any of the keys, the scheme in any case", () => {
    expect(chat("Bearer sk-a")).toBe(true);
    expect(chat("Bearer sk-b")).toBe(true);
    expect(chat("bearer sk-a")).toBe(true);
    expect(chat("BEARER sk-b")).toBe(true);
  });

  it("refuses a /v1 request with no header, another key, another scheme or the key not after the first space", () => {
    for (const h of [
      undefined,
      "",
      "sk-a",
      "Bearer",
      "Bearer ",
      "Bearer sk-c",
      "Basic sk-a",
      "Bearer  sk-a",
      "Bearer sk-a ",
    ]) {
      expect(chat(h), String(h)).toBe(false);
    }
    expect(vllmAuthorized(keys, "/v1/models", "GET", undefined)).toBe(false);
    expect(vllmAuthorized(keys, "/v1/no-such-route", "GET", undefined)).toBe(false);
  });

  it("checks only paths that start with /v1, and never OPTIONS", () => {
    for (const path of ["/health", "/metrics", "/version", "/ping", "/", "/v2/models"]) {
      expect(vllmAuthorized(keys, path, "GET", undefined), path).toBe(true);
    }
    expect(chat(undefined, "OPTIONS")).toBe(true);
  });

  it("without keys lets everything through, whatever the header", () => {
    const none = new Secrets([]);
    expect(vllmAuthorized(none, "/v1/chat/completions", "POST", undefined)).toBe(true);
    expect(vllmAuthorized(none, "/v1/chat/completions", "POST", "Bearer anything")).toBe(true);
  });
});

describe("SGLang's rule, where it differs", () => {
  const bearer = sglangSecrets("sk-s");

  it("wants the header to be exactly `Bearer KEY`", () => {
    expect(sglangAuthorized(bearer, "/v1/chat/completions", "POST", "Bearer sk-s")).toBe(true);
    for (const h of [undefined, "bearer sk-s", "Bearer  sk-s", "sk-s", "Bearer sk-t"]) {
      expect(sglangAuthorized(bearer, "/v1/chat/completions", "POST", h), String(h)).toBe(false);
    }
  });

  it("checks every path but /health* and /metrics*, and never OPTIONS", () => {
    for (const path of ["/server_info", "/model_info", "/ping", "/v1/models"]) {
      expect(sglangAuthorized(bearer, path, "GET", undefined), path).toBe(false);
    }
    for (const path of ["/health", "/health_generate", "/metrics"]) {
      expect(sglangAuthorized(bearer, path, "GET", undefined), path).toBe(true);
    }
    expect(sglangAuthorized(bearer, "/server_info", "OPTIONS", undefined)).toBe(true);
  });

  it("without --api-key lets everything through", () => {
    expect(sglangAuthorized(sglangSecrets(undefined), "/server_info", "GET", undefined)).toBe(true);
  });
});
