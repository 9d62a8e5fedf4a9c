import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createLogger } from "../common/log.ts";
import { base64Float32, EMBEDDING_DIM, embeddingVector, float32Base64 } from "./embeddings.ts";
import { DEFAULT_H100_8B_CORE, EngineCore, type EngineCoreConfig } from "./engine-core.ts";
import { FaultPlan } from "./faults.ts";
import { H100_LLAMA_3_1_8B, stepSeconds } from "./latency-model.ts";
import { ApiError, EmbeddingRequest, embeddingInputs, MAX_EMBEDDING_INPUTS } from "./protocol.ts";
import { Runner } from "./runner.ts";
import type { SeqSpec } from "./scheduler.ts";
import { SimServer } from "./server.ts";
import { BOS, completionPromptTokens, tokenize } from "./text.ts";

const norm = (v: ArrayLike<number>) => Math.sqrt(Array.from(v).reduce((s, x) => s + x * x, 0));
const cosine = (a: ArrayLike<number>, b: ArrayLike<number>) =>
  Array.from(a).reduce((s, x, i) => s + x * b[i]!, 0) / (norm(a) * norm(b));
const ids = (text: string) => completionPromptTokens(text);
const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

describe("embeddingVector", () => {
  it("is deterministic, float32, unit length, EMBEDDING_DIM long", () => {
    const a = embeddingVector(ids("The quick brown fox jumps over the lazy dog."));
    const b = embeddingVector(ids("The quick brown fox jumps over the lazy dog."));
    expect(a).toBeInstanceOf(Float32Array);
    expect(a).toHaveLength(EMBEDDING_DIM);
    expect(EMBEDDING_DIM).toBe(384);
    expect(Array.from(a)).toEqual(Array.from(b));
    expect(norm(a)).toBeCloseTo(1, 5);
    expect(new Set(a).size).toBeGreaterThan(EMBEDDING_DIM / 2); // dense, not a few spikes
  });

  it("is the same for a text and its token ids, and ignores BOS", () => {
    const text = "Hello, world!";
    const tokenIds = tokenize(text);
    expect(Array.from(embeddingVector(ids(text)))).toEqual(Array.from(embeddingVector(tokenIds)));
    expect(Array.from(embeddingVector([BOS, ...tokenIds]))).toEqual(Array.from(embeddingVector(tokenIds)));
    // An empty input still has a (fixed) unit vector.
    expect(norm(embeddingVector(ids("")))).toBeCloseTo(1, 5);
    expect(Array.from(embeddingVector(ids("")))).toEqual(Array.from(embeddingVector([BOS])));
  });

  it("puts texts that share tokens closer than unrelated ones", () => {
    const q = embeddingVector(ids("GPU nodes serve the model"));
    const near = embeddingVector(ids("GPU nodes serve the model fast"));
    const far = embeddingVector(ids("Bananas are yellow and sweet."));
    expect(cosine(q, near)).toBeGreaterThan(0.8);
    expect(Math.abs(cosine(q, far))).toBeLessThan(0.3);
    expect(cosine(q, near)).toBeLessThan(0.9999);
  });

  it("truncates Matryoshka style: the normalised prefix of the full vector", () => {
    const prompt = ids("dimensions are a prefix");
    const full = embeddingVector(prompt);
    for (const d of [1, 3, 64, 383]) {
      const v = embeddingVector(prompt, d);
      expect(v).toHaveLength(d);
      expect(norm(v)).toBeCloseTo(1, 5);
      const prefix = Array.from(full.slice(0, d));
      const n = norm(prefix);
      Array.from(v).forEach((x, i) => {
        expect(x).toBeCloseTo(prefix[i]! / n, 5);
      });
    }
    expect(() => embeddingVector(prompt, 0)).toThrow(RangeError);
    expect(() => embeddingVector(prompt, EMBEDDING_DIM + 1)).toThrow(RangeError);
  });

  it("handles a context-length prompt of distinct tokens", () => {
    // The worst case for the hashing: every token distinct. How long it takes is
    // bench:sim-engine's business, not a timed assertion here.
    const v = embeddingVector(range(131_072, 1));
    expect(v).toHaveLength(EMBEDDING_DIM);
    expect(Array.from(v).every(Number.isFinite)).toBe(true);
    expect(Math.hypot(...v)).toBeCloseTo(1, 5);
  });
});

describe("base64", () => {
  it("is little-endian float32, as OpenAI sends it", () => {
    expect(float32Base64(new Float32Array([1]))).toBe("AACAPw=="); // 0x3f800000 LE
    const v = embeddingVector(ids("round trip"));
    expect(Array.from(base64Float32(float32Base64(v)))).toEqual(Array.from(v));
  });
});

describe("embeddingInputs", () => {
  const inputs = (input: unknown) => {
    const r = EmbeddingRequest.parse({ model: "m", input });
    return embeddingInputs(r.input);
  };
  const refused = (input: unknown) => {
    const r = EmbeddingRequest.safeParse({ model: "m", input });
    if (!r.success) return "zod";
    try {
      embeddingInputs(r.data.input);
      return "accepted";
    } catch (err) {
      expect(err).toBeInstanceOf(ApiError);
      expect((err as ApiError).param).toBe("input");
      expect((err as ApiError).status).toBe(400);
      return "refused";
    }
  };

  it("takes a string, strings, token ids and arrays of token ids", () => {
    expect(inputs("a")).toEqual(["a"]);
    expect(inputs("")).toEqual([""]);
    expect(inputs(["a", "b"])).toEqual(["a", "b"]);
    expect(inputs([1, 2, 3])).toEqual([[1, 2, 3]]);
    expect(inputs([[1, 2], [3]])).toEqual([[1, 2], [3]]);
  });

  it("refuses anything else with param input", () => {
    expect(refused(undefined)).toBe("zod");
    expect(refused(5)).toBe("zod");
    expect(refused([])).toBe("zod");
    expect(refused(["a", 1])).toBe("refused");
    expect(refused([1, "a"])).toBe("refused");
    expect(refused([1.5])).toBe("refused");
    expect(refused([-1])).toBe("refused");
    expect(refused([[1], []])).toBe("refused");
    expect(refused([[1], [2, "x"]])).toBe("refused");
    expect(refused([{}])).toBe("refused");
    expect(refused(Array.from({ length: MAX_EMBEDDING_INPUTS }, () => "x"))).toBe("accepted");
    expect(refused(Array.from({ length: MAX_EMBEDDING_INPUTS + 1 }, () => "x"))).toBe("refused");
    expect(refused(Array.from({ length: MAX_EMBEDDING_INPUTS + 1 }, () => [1]))).toBe("refused");
    // The limit counts inputs, not the token ids of one input.
    expect(inputs(range(MAX_EMBEDDING_INPUTS + 1))).toHaveLength(1);
  });
});

function cfg(over: Partial<EngineCoreConfig> = {}): EngineCoreConfig {
  return { ...DEFAULT_H100_8B_CORE, ...over };
}

const pooling = (id: string, prompt: number[], arrival = 0): SeqSpec => ({
  id,
  promptIds: prompt,
  pooling: true,
  maxTokens: 0,
  naturalLength: 0,
  nextToken: () => 0,
  arrival,
});

describe("pooling sequences in the engine core", () => {
  it("cost one prefill, count prompt tokens and a stop, generate nothing", () => {
    const core = new EngineCore(cfg());
    core.submit(pooling("e", range(1000)));
    const step = core.startStep()!;
    expect(step.samples).toBe(false);
    expect(step.seconds).toBe(
      stepSeconds(H100_LLAMA_3_1_8B, { sequences: 1, tokens: 1000, contextTokens: 1000 }),
    );
    const events = core.finishStep(step.seconds);
    expect(events).toEqual([expect.objectContaining({ kind: "pooled", finished: "stop", at: step.seconds })]);
    const m = core.metrics;
    expect(m.promptTokens).toBe(1000);
    expect(m.generationTokens).toBe(0);
    expect(m.success).toEqual({ stop: 1, length: 0, abort: 0 });
    expect(m.ttft.count).toBe(1);
    expect(m.ttft.sum).toBeCloseTo(step.seconds, 12);
    expect(m.e2e.count).toBe(1);
    expect(core.hasWork()).toBe(false);
    expect(core.gauges().kvUsage).toBe(0);
    expect(core.startStep()).toBeUndefined();
  });

  it("chunk a long prompt by the batch budget and share steps with decodes", () => {
    const core = new EngineCore(cfg({ maxNumBatchedTokens: 100 }));
    core.submit({
      id: "gen",
      promptIds: range(10, 5000),
      maxTokens: 10,
      naturalLength: Number.POSITIVE_INFINITY,
      nextToken: (k) => 1_000_000 + k,
      arrival: 0,
    });
    let clock = 0;
    const run = () => {
      const step = core.startStep()!;
      clock += step.seconds;
      return { step, events: core.finishStep(clock) };
    };
    run(); // gen's prefill and first token
    core.submit(pooling("e", range(250)));
    const kinds: string[][] = [];
    const shapes: number[] = [];
    while (core.hasWork()) {
      const { step, events } = run();
      shapes.push(step.plan.shape.tokens);
      kinds.push(events.map((e) => `${e.seq.spec.id}:${e.kind}`));
    }
    expect(shapes.slice(0, 3)).toEqual([100, 100, 53]); // 1 decode + 99, 1 + 99, 1 + 52
    expect(kinds[2]).toEqual(["gen:token", "e:pooled"]);
    expect(core.metrics.promptTokens).toBe(10 + 250);
    expect(core.metrics.generationTokens).toBe(10);
  });

  it("use the prefix cache like any prompt", () => {
    const core = new EngineCore(cfg());
    for (const id of ["a", "b"]) {
      core.submit(pooling(id, range(64)));
      const step = core.startStep()!;
      core.finishStep(step.seconds);
    }
    expect(core.metrics.prefixQueries).toBe(128);
    expect(core.metrics.prefixHits).toBe(48); // the last block holds the last token: computed again
    expect(core.metrics.success.stop).toBe(2);
  });

  it("an abort in flight counts an abort and no prompt tokens", () => {
    const core = new EngineCore(cfg());
    core.submit(pooling("e", range(100)));
    const step = core.startStep()!;
    core.cancel("e", "abort", step.seconds / 2);
    expect(core.finishStep(step.seconds).map((e) => e.kind)).toEqual(["aborted"]);
    expect(core.metrics.promptTokens).toBe(0);
    expect(core.metrics.success).toEqual({ stop: 0, length: 0, abort: 1 });
  });
});

/** The real HTTP server in process, on a loopback port, fast. */
describe("POST /v1/embeddings", () => {
  const MODEL = "emb-model";
  const MAX_MODEL_LEN = 4096;
  let server: SimServer;
  let runner: Runner;
  let url: string;

  beforeAll(async () => {
    runner = new Runner([new EngineCore(cfg())], 100, 0);
    server = new SimServer({
      rootModel: MODEL,
      servedModelNames: [MODEL, "alias"],
      maxModelLen: MAX_MODEL_LEN,
      seed: 0,
      outputLen: 16,
      promptTokensDetails: false,
      faults: new FaultPlan({ seed: 0, failRate: 0, hangPhase: "first-token" }),
      runner,
      log: createLogger({}, "error"),
    });
    await new Promise<void>((resolve) => server.http.listen(0, "127.0.0.1", resolve));
    server.markReady();
    url = `http://127.0.0.1:${(server.http.address() as AddressInfo).port}`;
  });

  afterAll(() => {
    runner.stop();
    server.http.closeAllConnections();
    server.http.close();
  });

  const post = (body: unknown, path = "/v1/embeddings") =>
    fetch(`${url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });

  interface EmbeddingsResponse {
    id: string;
    object: string;
    created: number;
    model: string;
    data: { index: number; object: string; embedding: number[] | string }[];
    usage: { prompt_tokens: number; total_tokens: number; completion_tokens: number };
  }

  async function embed(body: Record<string, unknown>): Promise<EmbeddingsResponse> {
    const res = await post({ model: MODEL, ...body });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/json");
    return (await res.json()) as EmbeddingsResponse;
  }

  async function metric(name: string, labels = ""): Promise<number> {
    const text = await (await fetch(`${url}/metrics`)).text();
    let sum = 0;
    for (const line of text.split("\n")) {
      if (line.startsWith(`${name}{`) && line.includes(labels)) sum += Number(line.split(" ").at(-1));
    }
    return sum;
  }

  it("answers in OpenAI's shape, one vector per input, in order", async () => {
    const input = ["The edge routes requests.", "Bananas.", "The edge routes requests."];
    const r = await embed({ input });
    expect(r).toMatchObject({ object: "list", model: MODEL });
    expect(r.id).toMatch(/^embd-[0-9a-f]{32}$/);
    expect(r.data.map((d) => [d.index, d.object])).toEqual([
      [0, "embedding"],
      [1, "embedding"],
      [2, "embedding"],
    ]);
    const [a, b, c] = r.data.map((d) => d.embedding as number[]);
    expect(a).toHaveLength(EMBEDDING_DIM);
    expect(norm(a!)).toBeCloseTo(1, 5);
    expect(c).toEqual(a);
    expect(b).not.toEqual(a);
    expect(a).toEqual(Array.from(embeddingVector(ids(input[0]!))));
    const prompt = input.reduce((s, t) => s + ids(t).length, 0);
    expect(r.usage).toEqual({ prompt_tokens: prompt, total_tokens: prompt, completion_tokens: 0 });
  });

  it("counts prompt tokens exactly as a completion of the same text does", async () => {
    const text = "Hello, world! Count me the same way everywhere.";
    const e = await embed({ input: text, model: "alias" });
    expect(e.model).toBe("alias");
    const c = await post({ model: MODEL, prompt: text, max_tokens: 1 }, "/v1/completions");
    const { usage } = (await c.json()) as { usage: { prompt_tokens: number } };
    expect(e.usage.prompt_tokens).toBe(usage.prompt_tokens);
    expect(e.usage.prompt_tokens).toBe(1 + tokenize(text).length);
  });

  it("takes token ids, one prompt or several", async () => {
    const one = await embed({ input: [1, 2, 3] });
    expect(one.data).toHaveLength(1);
    expect(one.usage.prompt_tokens).toBe(4); // BOS + 3, like completions
    const two = await embed({ input: [[1, 2, 3], [4]] });
    expect(two.data).toHaveLength(2);
    expect(two.usage.prompt_tokens).toBe(4 + 2);
    expect(two.data[0]!.embedding).toEqual(one.data[0]!.embedding);
  });

  it("encodes base64 as little-endian float32 and honours dimensions", async () => {
    const input = "same text, two encodings";
    const f = await embed({ input, encoding_format: "float" });
    const b = await embed({ input, encoding_format: "base64" });
    expect(typeof b.data[0]!.embedding).toBe("string");
    expect(Array.from(base64Float32(b.data[0]!.embedding as string))).toEqual(f.data[0]!.embedding);
    const small = await embed({ input, dimensions: 64 });
    const v = small.data[0]!.embedding as number[];
    expect(v).toHaveLength(64);
    expect(norm(v)).toBeCloseTo(1, 5);
    const full = await embed({ input, dimensions: EMBEDDING_DIM });
    expect(full.data[0]!.embedding).toEqual(f.data[0]!.embedding);
  });

  it("feeds the engine's counters like finished requests", async () => {
    const before = {
      prompt: await metric("vllm:prompt_tokens_total"),
      generation: await metric("vllm:generation_tokens_total"),
      stop: await metric("vllm:request_success_total", 'finished_reason="stop"'),
      ttft: await metric("vllm:time_to_first_token_seconds_count"),
    };
    const r = await embed({ input: ["one", "two words", "and three words"] });
    expect(await metric("vllm:prompt_tokens_total")).toBe(before.prompt + r.usage.prompt_tokens);
    expect(await metric("vllm:generation_tokens_total")).toBe(before.generation);
    expect(await metric("vllm:request_success_total", 'finished_reason="stop"')).toBe(before.stop + 3);
    expect(await metric("vllm:time_to_first_token_seconds_count")).toBe(before.ttft + 3);
    expect(await metric("vllm:num_requests_running")).toBe(0);
  });

  it("refuses bad requests with vLLM's error shape, and counts nothing for them", async () => {
    const prompt = await metric("vllm:prompt_tokens_total");
    const cases: [Record<string, unknown>, number, string | null, RegExp][] = [
      [{ model: MODEL }, 400, "input", /^input: /],
      [{ model: MODEL, input: [] }, 400, "input", /^input: /],
      [{ model: MODEL, input: ["a", 1] }, 400, "input", /^input: expected a string/],
      [{ model: MODEL, input: 42 }, 400, "input", /^input: /],
      [{ model: MODEL, input: "x", encoding_format: "hex" }, 400, "encoding_format", /^encoding_format: /],
      [{ model: MODEL, input: "x", dimensions: 0 }, 400, "dimensions", /^dimensions: /],
      [{ model: MODEL, input: "x", dimensions: 1.5 }, 400, "dimensions", /^dimensions: /],
      [{ model: MODEL, input: "x", dimensions: EMBEDDING_DIM + 1 }, 400, "dimensions", /at most 384/],
      // BOS makes it one token too many.
      [{ model: MODEL, input: range(MAX_MODEL_LEN) }, 400, "input", /maximum context length is 4096 tokens/],
      [{ model: MODEL, input: [[1], range(MAX_MODEL_LEN)] }, 400, "input", /you requested 4097 tokens/],
      [{ model: "nope", input: "x" }, 404, "model", /The model `nope` does not exist/],
    ];
    for (const [body, status, param, message] of cases) {
      const res = await post(body);
      expect(res.status, JSON.stringify(body).slice(0, 80)).toBe(status);
      const { error } = (await res.json()) as { error: Record<string, unknown> };
      expect(error).toEqual({
        message: expect.stringMatching(message),
        type: status === 400 ? "BadRequestError" : "NotFoundError",
        param,
        code: status,
      });
    }
    const bad = await fetch(`${url}/v1/embeddings`, { method: "POST", body: "{not json" });
    expect(bad.status).toBe(400);
    expect((await fetch(`${url}/v1/embeddings`)).status).toBe(405);
    // The longest prompt that fits is taken.
    expect((await embed({ input: range(MAX_MODEL_LEN - 1) })).usage.prompt_tokens).toBe(MAX_MODEL_LEN);
    expect(await metric("vllm:prompt_tokens_total")).toBe(prompt + MAX_MODEL_LEN);
  });

  it("is not subject to the fault flags, and aborts what is left when the client goes", async () => {
    const slowRunner = new Runner([new EngineCore(cfg())], 1, 0);
    const slow = new SimServer({
      rootModel: MODEL,
      servedModelNames: [MODEL],
      maxModelLen: 131_072,
      seed: 0,
      outputLen: 16,
      promptTokensDetails: false,
      // Every generation request fails and the first one served would crash: embeddings do neither.
      faults: new FaultPlan({ seed: 0, failRate: 1, crashAfter: 0, hangPhase: "first-token" }),
      runner: slowRunner,
      crash: () => {
        throw new Error("crashed");
      },
      log: createLogger({}, "error"),
    });
    await new Promise<void>((resolve) => slow.http.listen(0, "127.0.0.1", resolve));
    slow.markReady();
    try {
      const base = `http://127.0.0.1:${(slow.http.address() as AddressInfo).port}`;
      const gen = await fetch(`${base}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: MODEL, prompt: "x", max_tokens: 1 }),
      });
      expect(gen.status).toBe(500);
      const ok = await fetch(`${base}/v1/embeddings`, {
        method: "POST",
        body: JSON.stringify({ model: MODEL, input: "x" }),
      });
      expect(ok.status).toBe(200);
      const core = slowRunner.cores[0]!;
      expect(core.metrics.promptTokens).toBe(2);
      const ctrl = new AbortController();
      // 100k tokens: 13 chunked-prefill steps of ~0.27 s each at speed 1.
      const req = fetch(`${base}/v1/embeddings`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, input: [range(100_000), range(10, 1)] }),
        signal: ctrl.signal,
      }).catch((e) => e);
      // Aborted once the engine is prefilling it, not before it arrives.
      await vi.waitFor(() => expect(core.hasWork()).toBe(true), { timeout: 5_000, interval: 10 });
      ctrl.abort();
      expect(await req).toBeInstanceOf(Error);
      await vi.waitFor(() => expect(core.hasWork()).toBe(false), { timeout: 5_000, interval: 20 });
      expect(core.metrics.promptTokens).toBe(2);
      expect(core.metrics.success.stop).toBe(1);
      expect(core.metrics.success.abort).toBe(2);
    } finally {
      slowRunner.stop();
      slow.http.closeAllConnections();
      slow.http.close();
    }
  });
});
