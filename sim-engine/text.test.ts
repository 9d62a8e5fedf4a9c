import { describe, expect, it } from "vitest";
import { FaultPlan } from "./faults.ts";
import { parseServeArgs } from "./flags.ts";
import {
  CHAT_GENERATION_PROMPT_TOKENS,
  CHAT_TOKENS_PER_MESSAGE,
  chatPromptTokens,
  completionPromptTokens,
  outputTokenText,
  planOutput,
  tokenize,
  tokenPieces,
} from "./text.ts";

describe("tokenizer", () => {
  it("cuts words with their leading space, punctuation alone, long pieces every 4 chars", () => {
    expect(tokenPieces("Hello, world!")).toEqual(["Hell", "o", ",", " wor", "ld", "!"]);
    expect(tokenPieces("a  b")).toEqual(["a", "  b"]);
    expect(tokenize("")).toEqual([]);
  });

  it("adds the documented chat template overhead", () => {
    const content = "one two three";
    const n = tokenize(content).length;
    const ids = chatPromptTokens([
      { role: "system", content },
      { role: "user", content },
    ]);
    expect(ids.length).toBe(1 + 2 * (CHAT_TOKENS_PER_MESSAGE + n) + CHAT_GENERATION_PROMPT_TOKENS);
    expect(completionPromptTokens(content).length).toBe(1 + n);
    expect(completionPromptTokens([5, 6, 7])).toHaveLength(4);
  });

  it("writes the same text for the same seed and prompt, and text that re-tokenizes to its count", () => {
    const prompt = chatPromptTokens([{ role: "user", content: "hi" }]);
    const a = planOutput(42, prompt, 128);
    const b = planOutput(42, prompt, 128);
    const c = planOutput(43, prompt, 128);
    const text = (p: typeof a) =>
      Array.from({ length: 50 }, (_, i) => outputTokenText(p.tokenAt(i))).join("");
    expect(text(a)).toBe(text(b));
    expect(text(a)).not.toBe(text(c));
    expect(a.naturalLength).toBe(b.naturalLength);
    expect(a.naturalLength).toBeGreaterThanOrEqual(64);
    expect(a.naturalLength).toBeLessThanOrEqual(192);
    expect(tokenize(text(a)).length).toBe(50);
  });
});

describe("flags", () => {
  it("reads vllm serve's command line in both spellings and warns about the rest", () => {
    const f = parseServeArgs([
      "meta-llama/Llama-3.1-8B-Instruct",
      "--host=127.0.0.1",
      "--port",
      "9001",
      "--served-model-name",
      "llama",
      "llama-8b",
      "-tp",
      "2",
      "--pipeline_parallel_size=1",
      "--gpu-memory-utilization",
      "0.85",
      "--max-model-len",
      "32k",
      "--no-enable-prefix-caching",
      "--enforce-eager",
      "--dtype",
      "bfloat16",
      "--seed",
      "-3",
      "--sim-speed=50",
      "--sim-hang-phase",
      "mid-stream",
    ]);
    expect(f).toMatchObject({
      host: "127.0.0.1",
      port: 9001,
      servedModelNames: ["llama", "llama-8b"],
      tensorParallelSize: 2,
      gpuMemoryUtilization: 0.85,
      maxModelLen: 32_000,
      enablePrefixCaching: false,
      seed: -3,
      sim: { speed: 50, hangPhase: "mid-stream" },
    });
    expect(f.ignored).toEqual(["--enforce-eager", "--dtype bfloat16"]);
  });

  it("refuses bad values with the flag's name", () => {
    expect(() => parseServeArgs(["m", "--port", "http"])).toThrow(/--port/);
    expect(() => parseServeArgs(["m", "--sim-fail-rate", "2"])).toThrow(/--sim-fail-rate/);
    expect(() => parseServeArgs(["--port", "1"])).toThrow(/MODEL/);
    expect(() => parseServeArgs(["m", "--nnodes", "2", "--node-rank", "2"])).toThrow(/node-rank/);
  });

  it("takes --sim-quirks space- or comma-separated, and refuses one it does not know", () => {
    expect([...parseServeArgs(["m", "--sim-quirks", "no-done", "pinned-model"]).sim.quirks]).toEqual([
      "no-done",
      "pinned-model",
    ]);
    expect([...parseServeArgs(["m", "--sim-quirks=usage-on-finish,fastapi-errors"]).sim.quirks]).toEqual([
      "usage-on-finish",
      "fastapi-errors",
    ]);
    expect(parseServeArgs(["m"]).sim.quirks.size).toBe(0);
    expect(() => parseServeArgs(["m", "--sim-quirks", "no-dne"])).toThrow(/--sim-quirks/);
  });

  it("takes --api-key's keys, else VLLM_API_KEY's, dropping empty ones, as vLLM picks them", () => {
    const env = { VLLM_API_KEY: "sk-env" };
    expect(parseServeArgs(["m"]).apiKeys).toEqual([]);
    expect(parseServeArgs(["m"], env).apiKeys).toEqual(["sk-env"]);
    expect(parseServeArgs(["m"], { VLLM_API_KEY: "" }).apiKeys).toEqual([]);
    expect(parseServeArgs(["m", "--api-key", "sk-1", "sk-2", "--port", "1"], env)).toMatchObject({
      apiKeys: ["sk-1", "sk-2"],
      port: 1,
    });
    expect(parseServeArgs(["m", "--api_key=sk-1"], env).apiKeys).toEqual(["sk-1"]);
    // The command line wins even when it gives only an empty key: then there is none, as in vLLM.
    expect(parseServeArgs(["m", "--api-key", ""], env).apiKeys).toEqual([]);
    expect(() => parseServeArgs(["m", "--api-key"])).toThrow(/--api-key needs at least one value/);
    // A known flag now: its value is not echoed in the "accepted but not simulated" warning.
    expect(parseServeArgs(["m", "--api-key", "sk-1"]).ignored).toEqual([]);
  });
});

describe("fault plan", () => {
  it("fails a deterministic share of requests and counts only served ones toward crash/hang", () => {
    const fates = (seed: number) => {
      const p = new FaultPlan({ seed, failRate: 0.3, hangAfter: 5, hangPhase: "first-token" });
      return Array.from({ length: 200 }, () => p.next());
    };
    const a = fates(1);
    expect(fates(1)).toEqual(a);
    const failed = a.filter((f) => f === "fail").length;
    expect(failed).toBeGreaterThan(40);
    expect(failed).toBeLessThan(80);
    expect(a.filter((f) => f === "normal")).toHaveLength(5);
    const crash = new FaultPlan({ seed: 0, failRate: 0, crashAfter: 0, hangPhase: "first-token" });
    expect(crash.next()).toBe("crash");
  });

  it("keeps idle connections for VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds, 5 by default, as vLLM does", () => {
    expect(parseServeArgs(["m"]).httpKeepAliveSeconds).toBe(5);
    expect(parseServeArgs(["m"], { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "" }).httpKeepAliveSeconds).toBe(5);
    expect(parseServeArgs(["m"], { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "30" }).httpKeepAliveSeconds).toBe(30);
    expect(parseServeArgs(["m"], { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "0.5" }).httpKeepAliveSeconds).toBe(0.5);
    for (const bad of ["0", "-1", "5s", "never"]) {
      expect(() => parseServeArgs(["m"], { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: bad })).toThrow(
        /^VLLM_HTTP_TIMEOUT_KEEP_ALIVE: expected a number of seconds above 0/,
      );
    }
  });
});
