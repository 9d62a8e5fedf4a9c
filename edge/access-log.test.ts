import { describe, expect, it } from "vitest";
import { AccessLog } from "./access-log.ts";

describe("AccessLog", () => {
  it("writes one JSON line, once, with times from arrival", () => {
    const written: string[] = [];
    const log = new AccessLog("req_1", "/v1/chat/completions", 1_000, (l) => written.push(l));
    log.set({ key_id: "key_a", model: "m", status: 200 });
    log.firstByte(1_040);
    log.usage({ prompt_tokens: 3, completion_tokens: 7, total_tokens: 10 });
    log.end(1_100);
    log.set({ status: 500 });
    log.end(2_000);
    expect(written).toHaveLength(1);
    expect(JSON.parse(written[0]!)).toMatchObject({
      type: "llmgw.access",
      request_id: "req_1",
      key_id: "key_a",
      status: 200,
      ttft_ms: 40,
      prompt_tokens: 3,
      completion_tokens: 7,
      duration_ms: 100,
    });
  });
});
