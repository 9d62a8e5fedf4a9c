import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import { chatBody, type Edge, startEdge, stopStarted } from "./helpers.ts";

/**
 * An error the edge did not handle tells the client nothing internal
 * (docs/edge.md#errors): a generic OpenAI-shaped 500 with the request id;
 * the message stays in the Worker's log. Router settings the Worker cannot
 * use (a `retries` that is not a number, in LLMGW_ROUTER) make every
 * request fail that way.
 */
describe("unhandled errors at the edge", () => {
  let edge: Edge;

  beforeAll(async () => {
    edge = await startEdge({ retries: "many" }, "edge-internal-error");
  }, 120_000);

  afterAll(stopStarted);

  it("answers a generic 500 naming the request id, and logs the message", async () => {
    for (const [path, init] of [
      [
        "/v1/chat/completions",
        {
          method: "POST",
          body: JSON.stringify(chatBody("any")),
          headers: { "content-type": "application/json" },
        },
      ],
    ] as const) {
      const r = await fetch(`${edge.url}${path}`, {
        ...init,
        headers: {
          ...("headers" in init ? init.headers : {}),
          authorization: "Bearer sk-llmgw-anything-at-all",
        },
      });
      const text = await r.text();
      expect(r.status, path).toBe(500);
      const id = r.headers.get("x-request-id");
      expect(id, path).toMatch(/^req_[0-9a-f]{32}$/);
      expect(JSON.parse(text)).toEqual({
        error: {
          message: `The gateway failed to handle this request (request id ${id}).`,
          type: "server_error",
          code: "internal_error",
          param: null,
        },
      });
      expect(text).not.toContain("router settings");
      await waitUntil("the message in the log", () =>
        edge.proc
          .output()
          .split("\n")
          .some((l) => l.includes(id!) && l.includes("router settings are invalid")),
      );
    }
  });
});
