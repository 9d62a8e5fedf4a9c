import { describe, expect, it } from "vitest";
import { FlagError } from "./flags.ts";
import { parseSglangArgs } from "./sglang-flags.ts";
import { defaultMemFraction, derivedBatch, sglangSizing, simFlagsOf } from "./sglang-sizing.ts";

const base = ["--model-path", "meta-llama/Llama-3.1-8B-Instruct"];

describe("SGLang's command line", () => {
  it("has SGLang's defaults", () => {
    const f = parseSglangArgs(base);
    expect(f).toMatchObject({
      modelPath: "meta-llama/Llama-3.1-8B-Instruct",
      tokenizerPath: "meta-llama/Llama-3.1-8B-Instruct",
      servedModelName: "meta-llama/Llama-3.1-8B-Instruct",
      host: "127.0.0.1",
      port: 30000,
      tpSize: 1,
      ppSize: 1,
      dpSize: 1,
      nnodes: 1,
      nodeRank: 0,
      pageSize: 1,
      maxPrefillTokens: 16384,
      enableMetrics: false,
      disableRadixCache: false,
      logLevel: "info",
      ignored: [],
    });
    expect(f.maxRunningRequests).toBeUndefined();
    expect(f.memFractionStatic).toBeUndefined();
  });

  it("takes `--flag value` and `--flag=value`, SGLang's aliases, and switches without a value", () => {
    const f = parseSglangArgs([
      "--model=m",
      "--tp",
      "4",
      "--pp-size=2",
      "--data-parallel-size",
      "2",
      "--served-model-name",
      "llama",
      "--mem-fraction-static=0.8",
      "--enable-metrics",
      "--disable-radix-cache",
      "--max-running-requests",
      "64",
      "--max-total-tokens=100000",
      "--context-length",
      "8192",
      "--page-size",
      "16",
      "--chunked-prefill-size",
      "-1",
      "--max-prefill-tokens",
      "4096",
      "--trust-remote-code",
      "--log-level",
      "warning",
      "--api-key",
      "sk-1",
      "--nnodes",
      "2",
      "--node-rank",
      "1",
      "--dist-init-addr",
      "10.0.0.5:20011",
      "--sim-speed",
      "50",
    ]);
    expect(f).toMatchObject({
      modelPath: "m",
      tpSize: 4,
      ppSize: 2,
      dpSize: 2,
      servedModelName: "llama",
      memFractionStatic: 0.8,
      enableMetrics: true,
      disableRadixCache: true,
      maxRunningRequests: 64,
      maxTotalTokens: 100000,
      contextLength: 8192,
      pageSize: 16,
      chunkedPrefillSize: -1,
      maxPrefillTokens: 4096,
      trustRemoteCode: true,
      logLevel: "warning",
      apiKey: "sk-1",
      nnodes: 2,
      nodeRank: 1,
      distInitAddr: "10.0.0.5:20011",
    });
    expect(f.sim.speed).toBe(50);
  });

  it("accepts SGLang flags it does not model, with their values, and says which", () => {
    const f = parseSglangArgs([
      ...base,
      "--attention-backend",
      "fa3",
      "--enable-torch-compile",
      "--cuda-graph-max-bs=32",
      "--port",
      "31000",
    ]);
    expect(f.ignored).toEqual([
      "--attention-backend fa3",
      "--enable-torch-compile",
      "--cuda-graph-max-bs=32",
    ]);
    expect(f.port).toBe(31000);
  });

  it.each([
    [[], "--model-path: is required"],
    [["--port", "70000"], "--port:"],
    [["--port", "x"], "--port:"],
    [["--tp", "0"], "--tp-size:"],
    [["--mem-fraction-static", "1.2"], "--mem-fraction-static:"],
    [["--max-running-requests", "0"], "--max-running-requests:"],
    [["--page-size", "0"], "--page-size:"],
    [["--log-level", "loud"], "--log-level:"],
    [["--dist-init-addr", "nohost"], "--dist-init-addr: expected HOST:PORT"],
    [["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 must be below --nnodes 2"],
    [["--enable-metrics=maybe"], "--enable-metrics:"],
    [["--max-total-tokens"], "--max-total-tokens: expected one argument"],
    [["stray"], "unrecognized arguments: stray"],
    [["--sim-speed", "0"], "--sim-speed:"],
  ])("refuses %j, naming the flag", (extra, message) => {
    const argv = extra.length === 0 ? [] : [...base, ...extra];
    expect(() => parseSglangArgs(argv)).toThrow(FlagError);
    expect(() => parseSglangArgs(argv)).toThrow(message);
  });
});

describe("SGLang's sizing", () => {
  const sized = (extra: string[]) => sglangSizing(parseSglangArgs([...base, ...extra]));

  it("pools the KV from --mem-fraction-static on an 80 GB H100: about 454k tokens for Llama 3.1 8B at TP 1", () => {
    const s = sized([]);
    expect(s.memFractionStatic).toBe(0.88);
    expect(s.maxTotalNumTokens).toBeGreaterThan(440_000);
    expect(s.maxTotalNumTokens).toBeLessThan(470_000);
    // SGLang's own rule: tokens / context × 512, within 2048..4096, at most one request per two tokens.
    expect(s.maxRunningRequests).toBe(2048);
    expect(s.contextLength).toBe(131_072);
    expect(s.maxReqLen).toBe(131_071);
    expect(s.maxReqInputLen).toBe(131_066);
    expect(s.chunkedPrefillSize).toBe(8192);
  });

  it("takes --max-total-tokens as a cap, cut to whole pages, and the limits follow it", () => {
    const s = sized(["--max-total-tokens", "20007", "--page-size", "16"]);
    expect(s.maxTotalNumTokens).toBe(20000);
    expect(s.maxReqLen).toBe(19999);
    expect(s.maxReqInputLen).toBe(19994);
    expect(s.kvCacheGiB).toBe(2.44);
    expect(s.weightGiB).toBe(14.96);
  });

  it("derives the batch from the pool when not given, never above half the pool", () => {
    expect(derivedBatch(454_000, 131_072)).toBe(2048);
    expect(derivedBatch(2_000_000, 131_072)).toBe(4096);
    expect(derivedBatch(1_000_000, 8192)).toBe(4096);
    expect(derivedBatch(3_000, 131_072)).toBe(1500);
    expect(sized(["--max-total-tokens", "20000"]).maxRunningRequests).toBe(2048);
    expect(sized(["--max-total-tokens", "1000"]).maxRunningRequests).toBe(500);
  });

  it("takes --max-running-requests per scheduler, capped by the pool, split only by DP attention", () => {
    expect(sized(["--max-running-requests", "48"]).maxRunningRequests).toBe(48);
    expect(sized(["--max-running-requests", "48", "--dp-size", "2"]).maxRunningRequests).toBe(48);
    expect(
      sized(["--max-running-requests", "48", "--dp-size", "2", "--enable-dp-attention"]).maxRunningRequests,
    ).toBe(24);
    expect(sized(["--max-running-requests", "4000", "--max-total-tokens", "1000"]).maxRunningRequests).toBe(
      500,
    );
  });

  it("shrinks the default memory fraction with TP as SGLang does, and gives each GPU its share of weights", () => {
    expect([1, 2, 4, 8, 16].map(defaultMemFraction)).toEqual([0.88, 0.87, 0.85, 0.81, 0.79]);
    const tp2 = sized(["--tp", "2"]);
    expect(tp2.weightGiB).toBe(7.48);
    expect(tp2.maxTotalNumTokens).toBeGreaterThan(sized([]).maxTotalNumTokens);
  });

  it("refuses a pool it cannot make, with SGLang's words", () => {
    expect(() => sized(["--mem-fraction-static", "0.1"])).toThrow(
      "Not enough memory. Please try to increase --mem-fraction-static.",
    );
    expect(() => sized(["--page-size", "3"])).toThrow(
      "--chunked-prefill-size: 8192 is not a multiple of --page-size 3",
    );
  });

  it("maps onto the sim engine's config: pages are KV blocks, the batch is max-num-seqs", () => {
    const f = parseSglangArgs([
      ...base,
      "--max-total-tokens",
      "20000",
      "--page-size",
      "16",
      "--max-running-requests",
      "48",
      "--dp-size",
      "2",
      "--disable-radix-cache",
      "--chunked-prefill-size",
      "4096",
    ]);
    const sim = simFlagsOf(f, sglangSizing(f));
    expect(sim).toMatchObject({
      servedModelNames: ["meta-llama/Llama-3.1-8B-Instruct"],
      dataParallelSize: 2,
      maxNumSeqs: 48,
      maxNumBatchedTokens: 4096,
      enablePrefixCaching: false,
      blockSize: 16,
      httpKeepAliveSeconds: 5,
      maxModelLen: 20000,
    });
    expect(sim.sim.kvBlocks).toBe(1250);
  });
});
