import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clientFor, createKey, type Edge, keyUsage } from "../edge/helpers.ts";
import { engineKeyOf } from "../harness/fleet.ts";
import { type LinkedStack, startLinkedStack } from "../harness/linked-stack.ts";
import { runLlmgw, waitUntil } from "../harness/process.ts";

/**
 * An SGLang replica end to end, on the real stack: the control plane places
 * a model whose profile says `engine: sglang` on an agent's simulated GPUs,
 * the agent launches it through the SGLang adapter (`python -m
 * sglang.launch_server …`, answered by the sim engine's SGLang persona,
 * test/bin/sglang), supervises it on SGLang's /health and scrapes SGLang's
 * metrics, and the edge serves it to the openai client. No batch is given
 * at launch: SGLang sizes it from memory, and only its server info says
 * what it came to.
 */
const ADMIN_TOKEN = "sglang-engine-test-admin-token";
const MODEL = "sg-small";
const KV_TOKENS = 20_000;

describe("an SGLang replica", () => {
  let edge: Edge;
  let stack: LinkedStack | undefined;

  beforeAll(async () => {
    stack = await startLinkedStack({
      tag: "sglang-engine",
      adminToken: ADMIN_TOKEN,
      models: `  - name: ${MODEL}
    profiles:
      - name: 1gpu
        engine: sglang
        source: test/sg-small
        # Tokens 30 ms apart: a stream lasts long enough for its load to be scraped and pushed.
        engine_args: ["--max-total-tokens", "${KV_TOKENS}", "--context-length", "2048", "--sim-speed", "50", "--sim-slow-token-ms", "30"]
        replicas: { min: 1 }
        startup_deadline: 60s
`,
      node: "sg-1",
      agent: { gpus: "1xH100-80GB", extra: ["--sglang-bin", "test/bin/sglang"] },
      routed: MODEL,
    });
    ({ edge } = stack);
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
  });

  /** The key the agent launched the replica's engine with. */
  const launchedKey = async () =>
    engineKeyOf(join(stack!.cp.dir, "agents", "sg-1"), (await stack!.cp.replicas())[0]!.id);
  const endpoint = async () => (await edge.sync.getPoolStatus({ model: MODEL })).pools[0]?.endpoints[0];

  it("reaches the pool with the batch its server info states and the KV tokens its metrics state", async () => {
    await waitUntil("capacity in the pool's endpoint", async () => {
      const e = await endpoint();
      return (e?.kvTokens ?? 0n) > 0n && (e?.maxNumSeqs ?? 0) > 0;
    });
    const e = (await endpoint())!;
    // The engine wants its key there, as SGLang does: the one the agent launched it with.
    const headers = { authorization: `Bearer ${await launchedKey()}` };
    expect((await fetch(`${e.url}/get_server_info`)).status).toBe(401);
    const info = (await (await fetch(`${e.url}/get_server_info`, { headers })).json()) as {
      internal_states: { effective_max_running_requests_per_dp: number }[];
    };
    const batch = info.internal_states.reduce((n, s) => n + s.effective_max_running_requests_per_dp, 0);
    expect(batch).toBeGreaterThan(0);
    expect(e.maxNumSeqs).toBe(batch);
    expect(e.kvTokens).toBe(BigInt(KV_TOKENS));
    const shown = await runLlmgw(["ctl", "endpoints", "status", MODEL, "--edge", edge.url], {
      LLMGW_EDGE_TOKEN: edge.token,
    });
    expect(shown.stdout).toContain(`${batch} seqs, ${KV_TOKENS.toLocaleString("en-US")} tokens`);
  }, 60_000);

  it("serves the openai client, streamed and not, with exact usage", async () => {
    const key = await createKey(edge, { band: "gold" });
    const openai = clientFor(edge, key.secret);
    const reply = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Say hello." }],
      max_tokens: 8,
    });
    expect(reply.choices[0]?.message.content).toBeTruthy();
    expect(reply.usage?.completion_tokens).toBeGreaterThan(0);

    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Count to five." }],
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage: { completion_tokens: number } | undefined | null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(usage?.completion_tokens).toBeGreaterThan(0);
    // The key is charged what SGLang counted, both ways, nothing estimated.
    const want = (reply.usage?.completion_tokens ?? 0) + (usage?.completion_tokens ?? 0);
    const charged = await waitUntil("both requests charged", async () => {
      const u = await keyUsage(edge, key.id);
      return u.requests === 2 ? u : undefined;
    });
    expect(charged).toMatchObject({ completion: want, estimatedRequests: 0 });
  }, 60_000);

  it("is load the agent scrapes off SGLang's own metric names: its running requests reach the pool", async () => {
    const key = await createKey(edge, { band: "gold" });
    const openai = clientFor(edge, key.secret);
    const stop = new AbortController();
    const streams = Array.from({ length: 3 }, () =>
      openai.chat.completions
        .create(
          {
            model: MODEL,
            messages: [{ role: "user", content: "Tell a long story." }],
            max_tokens: 400,
            stream: true,
            // SGLang's sampling parameter, passed through: the stream runs its whole length.
            ...{ ignore_eos: true },
          },
          { signal: stop.signal },
        )
        .then(async (s) => {
          for await (const _ of s);
        })
        .catch(() => {}),
    );
    try {
      await waitUntil("the engine's running requests in the pool's view", async () => {
        const e = await endpoint();
        return (e?.running ?? 0) >= 1;
      });
    } finally {
      stop.abort();
      await Promise.all(streams);
    }
  }, 60_000);

  it("is launched with its key on its command line, which the agent blanks out of what it logs and shows", async () => {
    const agentDir = join(stack!.cp.dir, "agents", "sg-1");
    const key = await launchedKey();
    expect(key).toMatch(/^llmgw-e-/);
    const logs = join(agentDir, "logs");
    const engineLog = readdirSync(logs)
      .map((f) => readFileSync(join(logs, f), "utf8"))
      .join("\n");
    expect(engineLog).toMatch(/starting: .* --api-key \[engine key\] /);
    for (const shown of [engineLog, stack!.agent.output(), (await stack!.cp.ctl("explain", MODEL)).stdout])
      expect(shown).not.toContain(key);
  });

  it("has its own error bodies and completion streams turned into OpenAI's at the edge", async () => {
    const key = await createKey(edge, { band: "gold" });
    const openai = clientFor(edge, key.secret);
    // SGLang answers a prompt past its context with a flat {"object":"error",…} body.
    const err = await openai.chat.completions
      .create({ model: MODEL, messages: [{ role: "user", content: "word ".repeat(3000) }], max_tokens: 4 })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ status: 400, type: "invalid_request_error" });
    expect((err as Error).message).toContain("context length");

    const stream = await openai.completions.create({
      model: MODEL,
      prompt: "Once",
      max_tokens: 6,
      stream: true,
    });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
    expect(text.length).toBeGreaterThan(0);
    // SGLang's own usage reached the charge: nothing was estimated, the refused request charged nothing.
    const u = await waitUntil("the stream charged", async () => {
      const x = await keyUsage(edge, key.id);
      return x.completion > 0 ? x : undefined;
    });
    expect(u).toMatchObject({ estimatedRequests: 0, partial: 0 });
  }, 60_000);
});
