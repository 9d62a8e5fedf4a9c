import { describe, expect, it } from "vitest";
import { kvTokensOf } from "./engine-capacity.ts";

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
