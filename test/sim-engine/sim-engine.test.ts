/**
 * The sim engine as a black box: real processes on loopback, driven with the
 * official `openai` client, plus every fault flag. Engines run at high
 * --sim-speed so the whole file stays well under 30 s.
 */
import { mkdtempSync, readFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FaultPlan } from "../../sim-engine/faults.ts";
import type { TraceRecord } from "../../sim-engine/request-trace.ts";
import { freePort, type Proc, startLlmgw, waitUntil } from "../harness/process.ts";
import { healthy, startVllmSim } from "./engine-process.ts";

const MODEL = "test-model";
const procs: Proc[] = [];

interface Engine {
  proc: Proc;
  port: number;
  url: string;
  client: OpenAI;
}

async function engine(
  name: string,
  flags: string[],
  viaShim = false,
  env: NodeJS.ProcessEnv = {},
): Promise<Engine> {
  const sim = await startVllmSim(name, MODEL, flags, { env, viaShim });
  procs.push(sim.proc);
  return { ...sim, client: new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "unused", maxRetries: 0 }) };
}

async function metric(e: Engine, name: string, labels = ""): Promise<number> {
  const text = await (await fetch(`${e.url}/metrics`)).text();
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    if (labels && !line.includes(labels)) continue;
    sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

const chatBody = (extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [
    { role: "user", content: "Tell me about the fleet of GPU nodes behind the edge, in a few words." },
  ],
  max_tokens: 8,
  ...extra,
});

async function post(e: Engine, path: string, body: unknown): Promise<Response> {
  return fetch(`${e.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

let main: Engine;
let failing: Engine;
let crashing: Engine;
let hangFirst: Engine;
let hangMid: Engine;
let headless: Engine;
let traced: Engine;
const traceFile = join(mkdtempSync(join(tmpdir(), "llmgw-sim-trace-")), "requests.jsonl");

beforeAll(async () => {
  [main, failing, crashing, hangFirst, hangMid, headless, traced] = await Promise.all([
    engine(
      "main",
      [
        "--served-model-name",
        MODEL,
        "alias",
        "--max-model-len",
        "2048",
        "--sim-speed",
        "50",
        "--seed",
        "7",
        "--dtype",
        "auto",
      ],
      true,
    ),
    engine("failing", ["--sim-fail-rate", "0.5", "--seed", "3", "--sim-speed", "50"]),
    engine("crashing", ["--sim-crash-after", "1", "--sim-speed", "50"]),
    engine("hang-first", ["--sim-hang-after", "1", "--sim-speed", "50"]),
    engine("hang-mid", ["--sim-hang-after", "0", "--sim-hang-phase", "mid-stream", "--sim-speed", "50"]),
    engine("headless", ["--headless", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"]),
    engine("traced", ["--sim-trace", traceFile, "--sim-speed", "20"]),
  ]);
  await Promise.all([main, failing, crashing, hangFirst, hangMid, traced].map(healthy));
});

afterAll(async () => {
  await Promise.all(procs.map((p) => p.kill("SIGKILL")));
});

describe("OpenAI surface", () => {
  it("lists the served model names with max_model_len", async () => {
    const list = await main.client.models.list();
    expect(list.data.map((m) => m.id)).toEqual([MODEL, "alias"]);
    expect((list.data[0] as unknown as { max_model_len: number }).max_model_len).toBe(2048);
    expect(main.proc.output()).toContain("flag accepted but not simulated");
  });

  it("answers chat non-streamed, deterministically for a seed, with exact usage in the counters", async () => {
    const before = {
      prompt: await metric(main, "vllm:prompt_tokens_total"),
      gen: await metric(main, "vllm:generation_tokens_total"),
    };
    const a = await main.client.chat.completions.create({ ...chatBody(), seed: 1 } as never);
    const b = await main.client.chat.completions.create({ ...chatBody(), seed: 1 } as never);
    const c = await main.client.chat.completions.create({
      ...chatBody({ model: "alias" }),
      seed: 2,
    } as never);
    expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content);
    expect(a.choices[0]!.message.content).not.toBe(c.choices[0]!.message.content);
    expect(a.choices[0]!.finish_reason).toBe("length");
    expect(a.usage!.completion_tokens).toBe(8);
    const completion = await main.client.completions.create({
      model: MODEL,
      prompt: "The edge routes",
      max_tokens: 5,
    });
    expect(completion.choices[0]!.text.length).toBeGreaterThan(0);
    expect(completion.usage!.completion_tokens).toBe(5);
    const all = [a.usage!, b.usage!, c.usage!, completion.usage!];
    expect(await metric(main, "vllm:prompt_tokens_total")).toBe(
      before.prompt + all.reduce((s, u) => s + u.prompt_tokens, 0),
    );
    expect(await metric(main, "vllm:generation_tokens_total")).toBe(
      before.gen + all.reduce((s, u) => s + u.completion_tokens, 0),
    );
    // The second identical prompt reused the first one's blocks.
    expect(await metric(main, "vllm:prefix_cache_hits_total")).toBeGreaterThan(0);
  });

  it("streams chat with include_usage: usage null on chunks, a final choices:[] usage chunk", async () => {
    const stream = await main.client.chat.completions.create({
      ...chatBody(),
      stream: true,
      stream_options: { include_usage: true },
    } as never);
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const ch of stream as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>) chunks.push(ch);
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage!.completion_tokens).toBe(8);
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(chunks.slice(0, -1).every((c) => c.usage === null)).toBe(true);
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
    expect(text.length).toBeGreaterThan(0);
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe("length");
  });

  it("streams completions with continuous usage on every chunk, and no usage key without include_usage", async () => {
    const res = await post(main, "/v1/completions", {
      model: MODEL,
      prompt: "hello",
      max_tokens: 4,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    });
    const events = (await res.text()).split("\n\n").filter(Boolean);
    expect(events.at(-1)).toBe("data: [DONE]");
    const json = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
    expect(json.map((j) => j.usage.completion_tokens)).toEqual([1, 2, 3, 4, 4]);
    expect(json.at(-1).choices).toEqual([]);

    const plain = await post(main, "/v1/completions", {
      model: MODEL,
      prompt: "hello",
      max_tokens: 2,
      stream: true,
    });
    const first = JSON.parse((await plain.text()).split("\n\n")[0]!.slice(6));
    expect("usage" in first).toBe(false);
  });

  it("honours stop strings and ignore_eos", async () => {
    const free = await main.client.completions.create({
      model: MODEL,
      prompt: "x",
      max_tokens: 40,
      seed: 5,
    } as never);
    const text = free.choices[0]!.text;
    const stop = text.slice(text.indexOf(" ", 3), text.indexOf(" ", 3) + 3);
    const cut = await main.client.completions.create({
      model: MODEL,
      prompt: "x",
      max_tokens: 40,
      seed: 5,
      stop,
    } as never);
    expect(cut.choices[0]!.finish_reason).toBe("stop");
    expect(cut.choices[0]!.text).toBe(text.slice(0, text.indexOf(stop)));
    const long = await main.client.completions.create({
      model: MODEL,
      prompt: "x",
      max_tokens: 300,
      ignore_eos: true,
    } as never);
    expect(long.usage!.completion_tokens).toBe(300);
  });

  it("reports load in vLLM's ORCA response header when asked", async () => {
    const res = await fetch(`${main.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "endpoint-load-metrics-format": "TEXT" },
      body: JSON.stringify({ prompt: "a", max_tokens: 1 }),
    });
    expect(res.headers.get("endpoint-load-metrics")).toMatch(
      /^TEXT named_metrics\.kv_cache_usage_perc=[\d.]+, named_metrics\.num_requests_waiting=[\d.]+$/,
    );
    await res.text();
  });

  it("rejects bad requests in vLLM's error shape", async () => {
    const tooLong = "word ".repeat(3000);
    await expect(
      main.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: tooLong }] }),
    ).rejects.toMatchObject({ status: 400 });
    await expect(
      main.client.chat.completions.create(chatBody({ model: "nope" }) as never),
    ).rejects.toMatchObject({
      status: 404,
    });
    await expect(main.client.chat.completions.create(chatBody({ n: 129 }) as never)).rejects.toMatchObject({
      status: 400,
      param: "n",
    });
    const bad = await post(main, "/v1/chat/completions", "{not json");
    expect(bad.status).toBe(400);
    const body = (await bad.json()) as { error: Record<string, unknown> };
    expect(body.error).toMatchObject({ type: "BadRequestError", code: 400, param: null });
    expect(typeof body.error.message).toBe("string");
    const invalid = await post(main, "/v1/chat/completions", { model: MODEL, messages: "hi" });
    expect(invalid.status).toBe(400);
    expect(((await invalid.json()) as { error: { param: string } }).error.param).toBe("messages");
  });

  it("stops generating promptly when the client disconnects, and counts what it generated", async () => {
    const gen0 = await metric(main, "vllm:generation_tokens_total");
    const ac = new AbortController();
    const res = await fetch(`${main.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(
        chatBody({
          max_tokens: 1500,
          ignore_eos: true,
          stream: true,
          stream_options: { include_usage: true, continuous_usage_stats: true },
        }),
      ),
      signal: ac.signal,
    });
    const reader = res.body!.getReader();
    let seen = 0;
    let buf = "";
    while (seen < 20) {
      const { value } = await reader.read();
      buf += new TextDecoder().decode(value);
      for (const m of buf.matchAll(/"completion_tokens":(\d+)/g)) seen = Math.max(seen, Number(m[1]));
    }
    ac.abort();
    await waitUntil(
      "request gone",
      async () => (await metric(main, "vllm:num_requests_running")) === 0,
      5000,
      20,
    );
    const counted = (await metric(main, "vllm:generation_tokens_total")) - gen0;
    // Nothing more is generated for it: a request after it adds exactly its own tokens.
    const barrier = await main.client.chat.completions.create(
      chatBody({ max_tokens: 3, ignore_eos: true }) as never,
    );
    expect((await metric(main, "vllm:generation_tokens_total")) - gen0).toBe(
      counted + barrier.usage!.completion_tokens,
    );
    expect(counted).toBeGreaterThanOrEqual(seen);
    expect(counted).toBeLessThan(1500);
    expect(
      await metric(main, "vllm:request_success_total", 'finished_reason="abort"'),
    ).toBeGreaterThanOrEqual(1);
  });
});

describe("fault injection", () => {
  it("--sim-startup-seconds: 503 on /health and the API until ready; --sim-slow-token-ms slows every token", async () => {
    // Started here, not with the others: its startup must still be under way when the test looks.
    const slow = await engine("slow", [
      "--sim-startup-seconds",
      "3",
      "--sim-slow-token-ms",
      "40",
      "--sim-speed",
      "50",
    ]);
    await waitUntil("slow listening", async () => (await fetch(`${slow.url}/health`)).status, 10_000, 50);
    expect((await fetch(`${slow.url}/health`)).status).toBe(503);
    const early = await post(slow, "/v1/chat/completions", chatBody());
    expect(early.status).toBe(503);
    expect(((await early.json()) as { error: { code: number } }).error.code).toBe(503);
    await healthy(slow);
    const t0 = performance.now();
    const r = await slow.client.chat.completions.create(chatBody({ max_tokens: 10 }) as never);
    expect(r.usage!.completion_tokens).toBe(10);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(10 * 40 - 5);
  });

  it("--sim-fail-rate: a deterministic share of requests gets 500", async () => {
    const statuses: number[] = [];
    for (let k = 0; k < 12; k++)
      statuses.push((await post(failing, "/v1/completions", { prompt: "a", max_tokens: 1 })).status);
    expect(statuses).toEqual(
      Array.from({ length: 12 }, (_, k) => (FaultPlan.failsAt(3, k, 0.5) ? 500 : 200)),
    );
    const err = await post(failing, "/v1/completions", { prompt: "a", max_tokens: 1 });
    if (err.status === 500)
      expect(((await err.json()) as { error: { type: string } }).error.type).toBe("InternalServerError");
  });

  it("--sim-crash-after N: N requests served, then headers + first token and exit 70", async () => {
    const ok = await crashing.client.chat.completions.create(chatBody() as never);
    expect(ok.usage!.completion_tokens).toBe(8);
    const res = await post(crashing, "/v1/chat/completions", chatBody({ stream: true, max_tokens: 50 }));
    expect(res.status).toBe(200);
    // The body ends in a reset, so read what arrived chunk by chunk.
    let text = "";
    const reader = res.body!.getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
      }
    } catch {
      text += "(connection reset)";
    }
    expect(text).toContain('"delta":{"content":');
    expect(text).not.toContain("[DONE]");
    expect(await crashing.proc.exited).toBe(70);
  });

  it("--sim-hang-after N --sim-hang-phase first-token: headers, then nothing; health stays 200", async () => {
    await hangFirst.client.chat.completions.create(chatBody() as never);
    const res = await post(hangFirst, "/v1/chat/completions", chatBody({ stream: true }));
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const got = await Promise.race([
      reader.read().then(() => "data"),
      new Promise((r) => setTimeout(() => r("silence"), 800)),
    ]);
    expect(got).toBe("silence");
    expect((await fetch(`${hangFirst.url}/health`)).status).toBe(200);
    await reader.cancel();
  });

  it("--sim-hang-phase mid-stream: one token, then nothing", async () => {
    const res = await post(hangMid, "/v1/chat/completions", chatBody({ stream: true }));
    const reader = res.body!.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    expect(first).toContain('"delta":{"content":');
    const next = await Promise.race([
      reader.read().then(() => "data"),
      new Promise((r) => setTimeout(() => r("silence"), 800)),
    ]);
    expect(next).toBe("silence");
    expect((await fetch(`${hangMid.url}/health`)).status).toBe(200);
    await reader.cancel();
  });

  it("--headless (non-zero rank): serves no API, stays alive, exits 0 on SIGTERM", async () => {
    await headless.proc.waitFor("headless worker", 10_000);
    await expect(fetch(`${headless.url}/health`)).rejects.toThrow();
    expect(headless.proc.child.exitCode).toBeNull();
    headless.proc.child.kill("SIGTERM");
    expect(await headless.proc.exited).toBe(0);
  });
});

describe("--sim-trace", () => {
  it("writes a line per request: arrival, first token and end on the wall clock, outcome and tokens", async () => {
    const sentAt = Date.now();
    const streamed = await fetch(`${traced.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "req_streamed" },
      body: JSON.stringify(chatBody({ stream: true, user: "u-streamed", max_tokens: 6 })),
    });
    const streamedText = await streamed.text();
    const gotAll = Date.now();
    const plain = await traced.client.chat.completions.create(chatBody({ user: "u-plain" }) as never);

    const ac = new AbortController();
    const cut = await fetch(`${traced.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody({ stream: true, user: "u-cut", max_tokens: 2000, ignore_eos: true })),
      signal: ac.signal,
    });
    const reader = cut.body!.getReader();
    await reader.read();
    ac.abort();
    await waitUntil(
      "cut request gone",
      async () => (await metric(traced, "vllm:num_requests_running")) === 0,
      5000,
      20,
    );
    traced.proc.child.kill("SIGTERM");
    expect(await traced.proc.exited).toBe(0);

    const lines = readFileSync(traceFile, "utf8").trim().split("\n");
    const byUser = new Map(
      lines.map((l) => JSON.parse(l) as TraceRecord).map((r) => [r.user, r] as [string | null, TraceRecord]),
    );
    expect(lines).toHaveLength(3);
    const s = byUser.get("u-streamed")!;
    expect(s).toMatchObject({ request_id: "req_streamed", outcome: "finished", completion_tokens: 6 });
    expect(s.id).toBe(JSON.parse(streamedText.split("\n\n")[0]!.slice(6)).id);
    // One clock for client and engine: the engine's instants fall inside the
    // client's. Within milliseconds, not exactly: the engine's wall clock is
    // its start time plus monotonic time, which can drift from the client's
    // Date.now() (by 11 ms once, in a CI run). A second of slack still tells
    // the one clock from a monotonic clock since the engine's start, which
    // would miss by decades.
    const SKEW_MS = 1_000;
    expect(s.arrived_ms).toBeGreaterThanOrEqual(sentAt - SKEW_MS);
    expect(s.first_token_ms!).toBeGreaterThan(s.arrived_ms);
    expect(s.ended_ms).toBeGreaterThanOrEqual(s.first_token_ms!);
    expect(s.ended_ms).toBeLessThanOrEqual(gotAll + SKEW_MS);
    const p = byUser.get("u-plain")!;
    expect(p).toMatchObject({
      id: plain.id,
      request_id: null,
      outcome: "finished",
      prompt_tokens: plain.usage!.prompt_tokens,
      completion_tokens: plain.usage!.completion_tokens,
    });
    const c = byUser.get("u-cut")!;
    expect(c.outcome).toBe("aborted");
    expect(c.completion_tokens).toBeGreaterThanOrEqual(1);
    expect(c.completion_tokens).toBeLessThan(2000);
  });

  it("refuses a trace file it cannot open, at startup", async () => {
    const bad = startLlmgw("bad-trace", [
      "sim-engine",
      "serve",
      MODEL,
      "--port",
      String(await freePort()),
      "--sim-trace",
      join(tmpdir(), "no-such-dir-llmgw", "t.jsonl"),
    ]);
    procs.push(bad);
    expect(await bad.exited).toBe(2);
    expect(bad.output()).toMatch(/--sim-trace: cannot open .*no-such-dir-llmgw.*ENOENT/);
  });
});

describe("idle connections", () => {
  it("closes a kept-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds idle, as vLLM's uvicorn does", async () => {
    const e = await engine("keep-alive", [], false, { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "0.5" });
    await healthy(e);
    const socket = connect(e.port, "127.0.0.1");
    let closed = false;
    let answer = "";
    socket.on("close", () => {
      closed = true;
    });
    socket.on("data", (bytes: Buffer) => {
      answer += bytes.toString("utf8");
    });
    socket.write("GET /health HTTP/1.1\r\nHost: engine\r\n\r\n");
    await waitUntil("the health answer", async () => answer.includes("\r\n\r\n"), 10_000, 20);
    // Answered and kept open, as HTTP/1.1 is by default: the engine, not the answer, ends it.
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect(answer.toLowerCase()).not.toContain("connection: close");
    expect(closed).toBe(false);
    // Well before the 5 s default: the variable, not the default, closed it.
    await waitUntil("the engine closed the idle connection", async () => closed, 4_000, 50);
  });

  it("refuses a VLLM_HTTP_TIMEOUT_KEEP_ALIVE that is not a number of seconds, at startup", async () => {
    const bad = startLlmgw(
      "bad-keep-alive",
      ["sim-engine", "serve", MODEL, "--port", String(await freePort())],
      { VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "5s" },
    );
    procs.push(bad);
    expect(await bad.exited).toBe(2);
    expect(bad.output()).toContain(
      'VLLM_HTTP_TIMEOUT_KEEP_ALIVE: expected a number of seconds above 0, got "5s"',
    );
  });
});
