import { describe, expect, it } from "vitest";
import { kvCapacityOf, kvCapacityOfAny, kvTokensOf, SGLANG_KV_CAPACITY } from "./engine-capacity.ts";

const info = (blocks: string, size: string) => ({
  name: "vllm:cache_config_info",
  labels: { num_gpu_blocks: blocks, block_size: size },
  value: 1,
});

describe("kvTokensOf", () => {
  it("sums blocks × block size over the data-parallel engines", () => {
    expect(kvTokensOf([info("27669", "16"), info("27669", "16")])).toBe(885_408);
  });

  it("knows nothing of a label that is no count, or of a product past exact", () => {
    expect(kvTokensOf([info("many", "16")])).toBe(0);
    expect(kvTokensOf([info(String(2 ** 40), String(2 ** 20))])).toBe(0);
  });
});

describe("kvCapacityOf an SGLang pool gauge", () => {
  const gauge = (value: number, labels: Record<string, string>) => ({
    name: "sglang:max_total_num_tokens",
    labels: { model_name: "m", engine_type: "unified", ...labels },
    value,
  });

  it("counts the tensor-parallel ranks of one pool once and adds the data-parallel ranks", () => {
    const samples = [
      gauge(20480, { tp_rank: "0", pp_rank: "0" }),
      gauge(20480, { tp_rank: "1", pp_rank: "0" }),
    ];
    expect(kvCapacityOf(samples, SGLANG_KV_CAPACITY)).toBe(20480);
    expect(
      kvCapacityOf(
        [gauge(10000, { dp_rank: "0", tp_rank: "0" }), gauge(10000, { dp_rank: "1", tp_rank: "0" })],
        SGLANG_KV_CAPACITY,
      ),
    ).toBe(20000);
  });

  it("is read by kvCapacityOfAny beside vLLM's info metric, whichever the engine exports", () => {
    expect(kvCapacityOfAny([gauge(4096, { tp_rank: "0" })])).toBe(4096);
    expect(kvCapacityOfAny([info("100", "16")])).toBe(1600);
    expect(kvCapacityOfAny([gauge(0.5, {})])).toBe(0);
  });
});
