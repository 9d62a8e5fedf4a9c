import { describe, expect, it } from "vitest";
import { capacityFromServerInfo } from "./sglang-server-info.ts";

// The shape SGLang's docs show for `curl /get_server_info` (an 0.5-series
// engine, one data-parallel rank), trimmed to what matters here.
const oneRank = {
  model_path: "qwen/qwen2.5-0.5b-instruct",
  api_key: "engine-secret",
  max_running_requests: null,
  dp_size: 1,
  max_total_num_tokens: 20480,
  max_req_input_len: 20474,
  internal_states: [
    {
      api_key: "engine-secret",
      last_gen_throughput: 357.2,
      memory_usage: { weight: 0.98, kvcache: 0.23, token_capacity: 20480, graph: 0.57 },
      effective_max_running_requests_per_dp: 128,
    },
  ],
  version: "0.5.4",
};

describe("capacityFromServerInfo", () => {
  it("reads the batch the scheduler runs and its pool", () => {
    expect(capacityFromServerInfo(oneRank)).toEqual({ maxNumSeqs: 128, kvTokens: 20480 });
  });

  it("adds the data-parallel ranks up", () => {
    const state = { effective_max_running_requests_per_dp: 24, memory_usage: { token_capacity: 10000 } };
    expect(
      capacityFromServerInfo({ dp_size: 2, max_total_num_tokens: 10000, internal_states: [state, state] }),
    ).toEqual({ maxNumSeqs: 48, kvTokens: 20000 });
  });

  it("falls back, for an older SGLang, to the argument per rank and the first scheduler's pool times dp_size", () => {
    const older = {
      max_running_requests: 96,
      dp_size: 2,
      max_total_num_tokens: 8000,
      internal_states: [{ last_gen_throughput: 0 }, { last_gen_throughput: 0 }],
    };
    // Each data-parallel rank's scheduler takes the whole argument...
    expect(capacityFromServerInfo(older)).toEqual({ maxNumSeqs: 192, kvTokens: 16000 });
    // ...unless DP attention splits it between them.
    expect(capacityFromServerInfo({ ...older, enable_dp_attention: true })).toEqual({
      maxNumSeqs: 96,
      kvTokens: 16000,
    });
  });

  it("states nothing it was not told, and nothing from a rank that says nonsense", () => {
    expect(capacityFromServerInfo({ version: "0.3.0" })).toEqual({});
    expect(
      capacityFromServerInfo({
        internal_states: [
          { effective_max_running_requests_per_dp: 8 },
          { effective_max_running_requests_per_dp: "x" },
        ],
      }),
    ).toEqual({});
  });

  it("refuses a body that is not server info at all", () => {
    expect(() => capacityFromServerInfo("<html>")).toThrow("not an SGLang server info");
    expect(() => capacityFromServerInfo(null)).toThrow("not an SGLang server info");
  });
});
