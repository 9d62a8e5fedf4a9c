/**
 * The sim engine's SGLang persona as a black box: real processes on
 * loopback, started through test/bin/sglang (the `python` the agent runs)
 * with the command line the agent's SGLang adapter builds, read with the
 * agent's own metrics parser and driven with the official `openai` client.
 */
import { create } from "@bufbuild/protobuf";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SGLANG_METRICS } from "../../agent/engines/adapter.ts";
import { sglangArgs } from "../../agent/engines/sglang.ts";
import { loadFromSamples } from "../../agent/scraper.ts";
import { parsePrometheusText } from "../../common/prometheus-text.ts";
import { StartShardSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { freePort, type Proc, REPO, startProcess, waitUntil } from "../harness/process.ts";
import { healthy } from "./engine-process.ts";

const SHIM = `${REPO}/test/bin/sglang`;
const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
const SERVED = "llama-8b";
const procs: Proc[] = [];

interface Engine {
  proc: Proc;
  url: string;
  client: OpenAI;
}

/** The agent's command line for one shard (agent/engines/sglang.ts), minus `python`. */
function agentArgv(
  port: number,
  o: { dp?: number; nodes?: number; rank?: number; args?: string[] },
): string[] {
  const spec = create(StartShardSchema, {
    replicaId: "sg-0",
    model: MODEL,
    servedModelName: SERVED,
    tensorParallel: 1,
    dataParallel: o.dp ?? 1,
    worldNodes: o.nodes ?? 1,
    rank: o.rank ?? 0,
    ports: { http: port, distInit: [port + 1] },
    peers: o.rank ? [{ rank: 0, address: "127.0.0.1", ports: { http: port, distInit: [port + 1] } }] : [],
    args: o.args ?? [],
  });
  return sglangArgs(spec, { advertiseAddress: "127.0.0.1" });
}

async function engine(name: string, argv: string[], env: NodeJS.ProcessEnv = {}): Promise<Engine> {
  const port = Number(argv[argv.indexOf("--port") + 1]);
  const proc = startProcess(name, SHIM, argv, env);
  procs.push(proc);
  const url = `http://127.0.0.1:${port}`;
  return { proc, url, client: new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 }) };
}

const quickHealth = { SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION: "false" };

// biome-ignore lint/suspicious/noExplicitAny: the JSON under test, read field by field
type Body = any;

async function json(e: Engine, path: string, init?: RequestInit): Promise<{ status: number; body: Body }> {
  const res = await fetch(`${e.url}${path}`, init);
  return { status: res.status, body: await res.json() };
}

const post = (e: Engine, path: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${e.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });

const chat = (extra: Record<string, unknown> = {}) => ({
  model: SERVED,
  messages: [{ role: "user" as const, content: "Tell me about the GPU nodes behind the edge, briefly." }],
  max_tokens: 8,
  ...extra,
});

/** The `data:` payloads of an SSE body, [DONE] included. */
const events = (text: string) =>
  text
    .split("\n\n")
    .filter((l) => l.startsWith("data: "))
    .map((l) => l.slice(6));

async function metrics(e: Engine) {
  const text = await (await fetch(`${e.url}/metrics`)).text();
  const samples = parsePrometheusText(text).samples;
  const value = (name: string) => samples.filter((s) => s.name === name).reduce((sum, s) => sum + s.value, 0);
  return { text, samples, load: loadFromSamples(samples, SGLANG_METRICS), value };
}

let dp2: Engine;
let derived: Engine;
let busy: Engine;

beforeAll(async () => {
  const [p1, p2, p3] = await Promise.all([freePort(), freePort(), freePort()]);
  [dp2, derived, busy] = await Promise.all([
    engine(
      "sglang-dp2",
      agentArgv(p1, {
        dp: 2,
        args: [
          "--max-running-requests",
          "48",
          "--max-total-tokens",
          "20000",
          "--page-size",
          "16",
          "--sim-speed",
          "50",
        ],
      }),
    ),
    // Not the agent's shape: no --enable-metrics, and an API key.
    engine(
      "sglang-derived",
      [
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
        "--port",
        String(p2),
        "--max-total-tokens",
        "3000",
        "--api-key",
        "sk-test",
        "--sim-speed",
        "50",
      ],
      quickHealth,
    ),
    engine(
      "sglang-busy",
      agentArgv(p3, {
        args: ["--max-running-requests", "2", "--max-total-tokens", "4096", "--page-size", "16"],
      }),
      quickHealth,
    ),
  ]);
  await Promise.all([dp2, derived, busy].map(healthy));
}, 30_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => p.kill("SIGKILL")));
});

describe("the SGLang persona's server info", () => {
  it("states the batch from --max-running-requests, the KV pool from --max-total-tokens, one state per DP rank", async () => {
    const { status, body } = await json(dp2, "/get_server_info");
    expect(status).toBe(200);
    expect(body).toMatchObject({
      model_path: MODEL,
      served_model_name: SERVED,
      tp_size: 1,
      dp_size: 2,
      page_size: 16,
      max_running_requests: 48,
      max_total_tokens: 20000,
      context_length: null,
      enable_metrics: true,
      api_key: null,
      status: "ready",
      max_total_num_tokens: 20000,
      max_req_input_len: 19994,
    });
    expect(body.internal_states).toHaveLength(2);
    for (const state of body.internal_states) {
      expect(state.effective_max_running_requests_per_dp).toBe(48);
      expect(state.memory_usage).toEqual({ weight: 14.96, kvcache: 2.44, token_capacity: 20000, graph: 0 });
    }
    expect(typeof body.version).toBe("string");
    // Current SGLang's name for it answers the same.
    expect((await json(dp2, "/server_info")).body.max_total_num_tokens).toBe(20000);
  });

  it("derives the batch from the KV pool when --max-running-requests is not given, and states the API key in clear", async () => {
    const auth = { authorization: "Bearer sk-test" };
    const { body } = await json(derived, "/get_server_info", { headers: auth });
    expect(body.max_running_requests).toBeNull();
    expect(body.max_total_num_tokens).toBe(3000);
    // min(max(3000 / 131072 × 512, 2048), 4096) = 2048, capped at one request per two tokens.
    expect(body.internal_states).toHaveLength(1);
    expect(body.internal_states[0].effective_max_running_requests_per_dp).toBe(1500);
    expect(body.api_key).toBe("sk-test");
    expect(body.internal_states[0].api_key).toBe("sk-test");
  });

  it("answers /get_model_info, /v1/models and /v1/models/{model} as SGLang does", async () => {
    expect((await json(dp2, "/get_model_info")).body).toMatchObject({
      model_path: MODEL,
      is_generation: true,
      model_type: "llama",
    });
    const models = (await json(dp2, "/v1/models")).body;
    expect(models.data).toEqual([
      expect.objectContaining({ id: SERVED, owned_by: "sglang", max_model_len: 131072 }),
    ]);
    expect((await json(dp2, `/v1/models/${SERVED}`)).body.id).toBe(SERVED);
    const missing = await json(dp2, "/v1/models/other");
    expect(missing.status).toBe(404);
    expect(missing.body.error.code).toBe("model_not_found");
  });
});

describe("the SGLang persona's HTTP", () => {
  it("answers /health after its one-token check, about a second, unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false", async () => {
    const t0 = performance.now();
    const slow = await fetch(`${dp2.url}/health`);
    const slowMs = performance.now() - t0;
    expect(slow.status).toBe(200);
    expect(await slow.text()).toBe("");
    expect(slowMs).toBeGreaterThanOrEqual(950);
    const t1 = performance.now();
    expect((await fetch(`${busy.url}/health`)).status).toBe(200);
    expect(performance.now() - t1).toBeLessThan(500);
    // /health_generate always generates.
    const t2 = performance.now();
    expect((await fetch(`${busy.url}/health_generate`)).status).toBe(200);
    expect(performance.now() - t2).toBeGreaterThanOrEqual(950);
  });

  it("serves /metrics only with --enable-metrics: without, FastAPI's 404", async () => {
    const res = await fetch(`${derived.url}/metrics`);
    expect(res.status).toBe(404);
    expect(await res.json()).toEqual({ detail: "Not Found" });
    expect((await fetch(`${dp2.url}/metrics`)).status).toBe(200);
  });

  it("with --api-key refuses a request without it, but not /health or /metrics", async () => {
    const refused = await post(derived, "/v1/chat/completions", chat());
    expect(refused.status).toBe(401);
    expect(await refused.json()).toEqual({ error: "Unauthorized" });
    expect((await fetch(`${derived.url}/health`)).status).toBe(200);
    const ok = await post(derived, "/v1/chat/completions", chat(), { authorization: "Bearer sk-test" });
    expect(ok.status).toBe(200);
  });

  it("answers a bad request 400 with SGLang's flat error body; an unknown route or method as FastAPI does", async () => {
    const bad = await post(dp2, "/v1/chat/completions", { model: SERVED, messages: "nope" });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ object: "error", type: "Bad Request", param: null, code: 400 });
    const long = await post(dp2, "/v1/completions", { model: SERVED, prompt: "x", max_tokens: 140_000 });
    expect(long.status).toBe(400);
    expect((await long.json()).message).toMatch(
      /^Requested token count exceeds the model's maximum context length/,
    );
    const text = await fetch(`${dp2.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "text/plain" },
      body: JSON.stringify(chat()),
    });
    expect(text.status).toBe(400);
    expect((await text.json()).message).toContain("Only 'application/json' is allowed");
    expect((await json(dp2, "/v1/chat/completions")).body).toEqual({ detail: "Method Not Allowed" });
    expect((await json(dp2, "/v1/nothing")).body).toEqual({ detail: "Not Found" });
  });

  it("serves the Responses API, as current SGLang does", async () => {
    const res = await post(dp2, "/v1/responses", { model: SERVED, input: "Hello", max_output_tokens: 4 });
    expect(res.status).toBe(200);
    expect((await res.json()).usage.output_tokens).toBe(4);
  });

  it("a rank > 0 of a multi-node replica serves no HTTP and lives until signalled", async () => {
    const port = await freePort();
    const follower = await engine("sglang-rank1", agentArgv(port, { nodes: 2, rank: 1, args: [] }));
    expect(follower.proc.child.spawnargs).toEqual(
      expect.arrayContaining(["--nnodes", "2", "--node-rank", "1"]),
    );
    await follower.proc.waitFor("headless worker", 20_000);
    await expect(fetch(`${follower.url}/health`)).rejects.toThrow();
    expect(follower.proc.child.exitCode).toBeNull();
    follower.proc.child.kill("SIGTERM");
    expect(await follower.proc.exited).toBe(0);
  });

  it("exits 2 on a bad flag, naming it", async () => {
    const proc = startProcess("sglang-bad", SHIM, [
      "-m",
      "sglang.launch_server",
      "--model-path",
      MODEL,
      "--port",
      "x",
    ]);
    procs.push(proc);
    expect(await proc.exited).toBe(2);
    expect(proc.output()).toContain("sim-engine: --port:");
  });
});

describe("the SGLang persona's wire, with the openai client", () => {
  it("answers whole, with a bare hex id, the asked model echoed and SGLang's usage", async () => {
    const reply = await dp2.client.chat.completions.create(chat({ model: "any-name", max_tokens: 5 }));
    expect(reply.id).toMatch(/^[0-9a-f]{32}$/);
    expect(reply.model).toBe("any-name");
    expect(reply.choices[0]!.finish_reason).toBe("length");
    expect(reply.choices[0]!.message.content).toBeTruthy();
    expect(reply.usage).toMatchObject({
      completion_tokens: 5,
      prompt_tokens_details: null,
      reasoning_tokens: 0,
    });
    expect((reply as unknown as { metadata: unknown }).metadata).toEqual({ weight_version: "default" });
  });

  it("streams: the finish in a chunk of its own, then the usage chunk, then [DONE]", async () => {
    const stream = await dp2.client.chat.completions.create({
      ...chat({ max_tokens: 6 }),
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    let lastContentFinish: string | null | undefined;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (c?.delta.content) {
        text += c.delta.content;
        lastContentFinish = c.finish_reason;
      }
      if (c?.finish_reason) finish = c.finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBeTruthy();
    expect(lastContentFinish).toBeNull();
    expect(finish).toBe("length");
    expect(usage?.completion_tokens).toBe(6);

    const raw = await (await post(dp2, "/v1/chat/completions", chat({ max_tokens: 2, stream: true }))).text();
    const data = events(raw);
    expect(data.at(-1)).toBe("[DONE]");
    const closing = JSON.parse(data.at(-2)!);
    expect(closing.choices[0]).toEqual({
      index: 0,
      delta: { reasoning_content: null },
      logprobs: null,
      finish_reason: "length",
      matched_stop: null,
    });
    expect(JSON.parse(data[0]!).choices[0].delta).toEqual({
      reasoning_content: null,
      role: "assistant",
      content: "",
    });
    expect(raw).not.toContain('"usage"');
  });

  it("reports a stop string it matched, and continuous usage without include_usage", async () => {
    const free = await (await post(dp2, "/v1/chat/completions", chat({ max_tokens: 12 }))).json();
    const stop = ` ${(free.choices[0].message.content as string).trim().split(" ")[3]}`;
    const cut = await (
      await post(dp2, "/v1/chat/completions", chat({ max_tokens: 12, stop: [stop] }))
    ).json();
    expect(cut.choices[0]).toMatchObject({ finish_reason: "stop", matched_stop: stop });
    expect(free.choices[0]).toMatchObject({ finish_reason: "length", matched_stop: null });
    const raw = await (
      await post(dp2, "/v1/completions", {
        model: SERVED,
        prompt: "Hello",
        max_tokens: 3,
        stream: true,
        stream_options: { continuous_usage_stats: true },
      })
    ).text();
    const chunks = events(raw)
      .filter((d) => d !== "[DONE]")
      .map((d) => JSON.parse(d));
    expect(chunks.map((c) => c.usage.completion_tokens)).toEqual([1, 2, 3]);
    expect(chunks.at(-1).choices[0].finish_reason).toBe("length");
    expect(chunks.every((c) => c.choices.length === 1)).toBe(true);
  });

  it("gives a completion without max_tokens 16 tokens, and serves embeddings", async () => {
    const c = await dp2.client.completions.create({ model: SERVED, prompt: "Once upon a time" });
    expect(c.usage?.completion_tokens).toBeLessThanOrEqual(16);
    if (c.choices[0]!.finish_reason === "length") expect(c.usage?.completion_tokens).toBe(16);
    const e = await dp2.client.embeddings.create({ model: SERVED, input: ["a cat", "a dog"] });
    expect(e.data).toHaveLength(2);
    expect(e.data[0]!.embedding.length).toBe(384);
  });
});

describe("the SGLang persona's metrics, read by the agent's parser", () => {
  it("carry SGLang's names and labels, one scheduler series per DP rank", async () => {
    const m = await metrics(dp2);
    expect(m.load.missing).toEqual([]);
    const running = m.samples.filter((s) => s.name === "sglang:num_running_reqs");
    expect(running.map((s) => s.labels)).toEqual([
      { model_name: SERVED, engine_type: "unified", tp_rank: "0", pp_rank: "0", dp_rank: "0" },
      { model_name: SERVED, engine_type: "unified", tp_rank: "0", pp_rank: "0", dp_rank: "1" },
    ]);
    expect(m.value("sglang:max_total_num_tokens")).toBe(40000);
    expect(m.text).toContain("# TYPE sglang:prompt_tokens counter");
  });

  it("show waiting, running and KV usage under load, and count a request's tokens when it finishes", async () => {
    const before = await metrics(busy);
    expect(before.load).toMatchObject({ running: 0, waiting: 0, kvUsage: 0 });
    const aborts = Array.from({ length: 5 }, () => new AbortController());
    const streams = aborts.map((a) =>
      busy.client.chat.completions
        .create({ ...chat({ max_tokens: 400, ignore_eos: true }), stream: true }, { signal: a.signal })
        .then(async (s) => {
          for await (const _ of s);
        })
        .catch(() => {}),
    );
    await waitUntil(
      "2 running and 3 waiting on the busy engine",
      async () => {
        const { load } = await metrics(busy);
        return load.running === 2 && load.waiting === 3 && load.kvUsage > 0;
      },
      15_000,
      25,
    );
    for (const a of aborts) a.abort();
    await Promise.all(streams);
    await waitUntil(
      "the aborts counted and the engine idle (an abort leaves at the end of the step in flight)",
      async () => {
        const m = await metrics(busy);
        return m.value("sglang:num_aborted_requests_total") === 5 && m.load.running + m.load.waiting === 0;
      },
    );
    const idle = await metrics(busy);
    // Abandoned requests count no tokens; a finished one counts all of its own at its end.
    expect(idle.load.generationTokens).toBe(0);
    const reply = await busy.client.chat.completions.create(chat({ max_tokens: 7 }));
    const after = await metrics(busy);
    expect(after.load.generationTokens).toBe(reply.usage!.completion_tokens);
    expect(after.value("sglang:prompt_tokens_total")).toBe(reply.usage!.prompt_tokens);
    expect(after.value("sglang:num_requests_total")).toBe(1);
    expect(after.value("sglang:time_to_first_token_seconds_count")).toBeGreaterThanOrEqual(1);
    expect(after.value("sglang:e2e_request_latency_seconds_count")).toBe(1);
  }, 30_000);
});
