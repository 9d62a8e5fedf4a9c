/**
 * The sim engine's feature tests (api-features, api-structured-output)
 * share these: an engine process with the official `openai` client, its
 * token counters, and a request sent streamed and not with the usages
 * checked against each other and the counters.
 */
import OpenAI from "openai";
import { expect } from "vitest";
import { z } from "zod";
import { freePort, type Proc, startLlmgw, waitForHttp, waitUntil } from "../harness/process.ts";

export const MODEL = "sim";
const procs: Proc[] = [];

/** Kills every engine `engine()` started in this file. */
export async function stopEngines(): Promise<void> {
  await Promise.all(procs.splice(0).map((p) => p.kill("SIGKILL")));
}

export interface Engine {
  proc: Proc;
  url: string;
  client: OpenAI;
}

/** An engine on a free loopback port; `ready: false` returns as soon as it listens (a starting engine's 503s). */
export async function engine(name: string, flags: string[], ready = true): Promise<Engine> {
  const port = await freePort();
  const proc = startLlmgw(name, [
    "sim-engine",
    "serve",
    MODEL,
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    "--sim-speed",
    "50",
    ...flags,
  ]);
  procs.push(proc);
  const url = `http://127.0.0.1:${port}`;
  if (ready) await waitForHttp(proc, `${url}/health`);
  else await waitUntil(`${name} listening`, async () => (await fetch(`${url}/metrics`)).ok, 20_000, 50);
  return { proc, url, client: new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 }) };
}

export async function metrics(e: Engine): Promise<Record<string, number>> {
  const text = await (await fetch(`${e.url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const m = /^(vllm:[a-z_]+)(?:\{[^}]*finished_reason="(\w+)"[^}]*\}|\{[^}]*\}) (\S+)$/.exec(line);
    if (!m) continue;
    const key = m[2] ? `${m[1]}:${m[2]}` : m[1]!;
    out[key] = (out[key] ?? 0) + Number(m[3]);
  }
  return out;
}

export const counted = (before: Record<string, number>, after: Record<string, number>) => ({
  prompt: after["vllm:prompt_tokens_total"]! - before["vllm:prompt_tokens_total"]!,
  generation: after["vllm:generation_tokens_total"]! - before["vllm:generation_tokens_total"]!,
  hits: after["vllm:prefix_cache_hits_total"]! - before["vllm:prefix_cache_hits_total"]!,
  aborted:
    (after["vllm:request_success_total:abort"] ?? 0) - (before["vllm:request_success_total:abort"] ?? 0),
});

/** What a stream said, per choice, put back together. */
interface StreamedChoice {
  content: string;
  role?: string;
  toolCall?: { id: string; name: string; arguments: string; heads: number };
  finish: string | null;
  logprobs: OpenAI.ChatCompletionTokenLogprob[];
  /** completion_tokens on this choice's last chunk (continuous stats count per choice). */
  lastUsage: number;
}

export async function streamChat(e: Engine, body: Record<string, unknown>) {
  const stream = await e.client.chat.completions.create({
    ...body,
    stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  } as never);
  const choices = new Map<number, StreamedChoice>();
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const chunk of stream as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>) {
    if (chunk.choices.length === 0) {
      usage = chunk.usage!;
      continue;
    }
    expect(chunk.choices).toHaveLength(1);
    const ch = chunk.choices[0]!;
    const c = choices.get(ch.index) ?? { content: "", finish: null, logprobs: [], lastUsage: 0 };
    choices.set(ch.index, c);
    if (ch.delta.role) c.role = ch.delta.role;
    c.content += ch.delta.content ?? "";
    for (const t of ch.delta.tool_calls ?? []) {
      expect(t.index).toBe(0);
      if (t.id) {
        expect(c.toolCall).toBeUndefined();
        c.toolCall = { id: t.id, name: t.function!.name!, arguments: "", heads: 1 };
      } else expect(t.function?.name).toBeUndefined();
      c.toolCall!.arguments += t.function?.arguments ?? "";
    }
    c.logprobs.push(...(ch.logprobs?.content ?? []));
    if (ch.finish_reason) c.finish = ch.finish_reason;
    c.lastUsage = chunk.usage!.completion_tokens;
  }
  const ordered = [...choices.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => c);
  return { choices: ordered, usage: usage! };
}

/**
 * The same request non-streamed, then streamed: returns both, after checking
 * that their usages are equal, that the streamed per-choice counts add up to
 * it, and that the engine's counters moved by exactly both usages.
 */
export async function bothWays(e: Engine, body: Record<string, unknown>) {
  const before = await metrics(e);
  const plain = await e.client.chat.completions.create(
    body as never as OpenAI.ChatCompletionCreateParamsNonStreaming,
  );
  const streamed = await streamChat(e, body);
  const after = await metrics(e);
  expect(streamed.usage).toEqual(plain.usage);
  expect(streamed.choices.reduce((s, c) => s + c.lastUsage, 0)).toBe(plain.usage!.completion_tokens);
  const moved = counted(before, after);
  expect(moved.prompt).toBe(2 * plain.usage!.prompt_tokens);
  expect(moved.generation).toBe(2 * plain.usage!.completion_tokens);
  return { plain, streamed, moved };
}

/** A raw streamed chat request with continuous usage, read chunk by chunk, and a hang-up. */
export async function rawStream(e: Engine, body: Record<string, unknown>) {
  const ac = new AbortController();
  const res = await fetch(`${e.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: MODEL,
      ...body,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    }),
    signal: ac.signal,
  });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  return {
    read: async () => decoder.decode((await reader.read()).value, { stream: true }),
    hangUp: () => ac.abort(),
  };
}

export const WEATHER: OpenAI.ChatCompletionFunctionTool = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", minLength: 2 },
        unit: { enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};
export const SEARCH: OpenAI.ChatCompletionFunctionTool = {
  type: "function",
  function: { name: "search_docs", parameters: { type: "object", properties: { q: { type: "string" } } } },
};
export const conforms = (schema: unknown, value: unknown) =>
  (z as unknown as { fromJSONSchema(s: unknown): z.ZodType }).fromJSONSchema(schema).safeParse(value).success;
export const user = (content: string) => [{ role: "user" as const, content }];
