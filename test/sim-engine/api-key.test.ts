/**
 * The sim engine's vLLM persona requires an API key the way vLLM does:
 * `--api-key KEY...` or `VLLM_API_KEY` (the agent launches engines with the
 * variable, the edge sends `Authorization: Bearer KEY`). Real processes on
 * loopback, driven with the official `openai` client and plain fetch.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Proc } from "../harness/process.ts";
import { healthy, startVllmSim } from "./engine-process.ts";

const MODEL = "test-model";
const procs: Proc[] = [];

interface Engine {
  proc: Proc;
  url: string;
}

async function engine(
  name: string,
  flags: string[],
  env: NodeJS.ProcessEnv,
  viaShim = false,
): Promise<Engine> {
  const sim = await startVllmSim(name, MODEL, ["--sim-speed", "50", ...flags], { env, viaShim });
  procs.push(sim.proc);
  return sim;
}

const client = (e: Engine, apiKey: string) => new OpenAI({ baseURL: `${e.url}/v1`, apiKey, maxRetries: 0 });

const chatBody = {
  model: MODEL,
  messages: [{ role: "user" as const, content: "Which keys open the engine?" }],
  max_tokens: 8,
};

/** A chat completion with `authorization` as the header (none when undefined). */
function post(e: Engine, authorization?: string): Promise<Response> {
  return fetch(`${e.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(authorization ? { authorization } : {}) },
    body: JSON.stringify(chatBody),
  });
}

/** Asserts vLLM's refusal, byte for byte. */
async function expectUnauthorized(res: Response): Promise<void> {
  expect(res.status).toBe(401);
  expect(res.headers.get("content-type")).toBe("application/json");
  expect(await res.text()).toBe('{"error":"Unauthorized"}');
}

/** Served: a chat completion, and a streamed one to its end. */
async function expectServed(e: Engine, key: string): Promise<void> {
  const c = client(e, key);
  const whole = await c.chat.completions.create(chatBody);
  expect(whole.usage?.completion_tokens).toBe(8);
  expect(whole.choices[0]?.message.content).toBeTruthy();
  const stream = await c.chat.completions.create({ ...chatBody, stream: true });
  let text = "";
  let finish: string | null | undefined;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  expect(text).toBe(whole.choices[0]?.message.content);
  expect(finish).toBe("length");
}

let fromEnv: Engine;
let cliWins: Engine;
let twoKeys: Engine;
let open: Engine;

beforeAll(async () => {
  [fromEnv, cliWins, twoKeys, open] = await Promise.all([
    // Through test/bin/vllm, as the agent launches vLLM: the variable reaches the engine by exec.
    engine("env-key", [], { VLLM_API_KEY: "sk-env" }, true),
    engine("cli-wins", ["--api-key", "sk-cli"], { VLLM_API_KEY: "sk-env" }),
    engine("two-keys", ["--api-key", "sk-one", "sk-two"], { VLLM_API_KEY: "" }),
    engine("open", [], { VLLM_API_KEY: "" }),
  ]);
  await Promise.all([fromEnv, cliWins, twoKeys, open].map(healthy));
});

afterAll(async () => {
  await Promise.all(procs.map((p) => p.kill("SIGKILL")));
});

describe("sim engine API key (vLLM persona)", () => {
  it("with VLLM_API_KEY serves the openai client that sends the key, whole and streamed", async () => {
    await expectServed(fromEnv, "sk-env");
  });

  it('refuses a wrong key, another scheme and no key with 401 {"error":"Unauthorized"}', async () => {
    await expectUnauthorized(await post(fromEnv, "Bearer sk-wrong"));
    await expectUnauthorized(await post(fromEnv, "Basic sk-env"));
    await expectUnauthorized(await post(fromEnv));
    await expectUnauthorized(await fetch(`${fromEnv.url}/v1/models`));
    // The middleware comes before the routes: a /v1 path the engine does not have is a 401 too.
    await expectUnauthorized(await fetch(`${fromEnv.url}/v1/no-such-route`));
    await expect(client(fromEnv, "sk-wrong").chat.completions.create(chatBody)).rejects.toMatchObject({
      status: 401,
    });
    // The scheme is read in any case, as vLLM reads it.
    expect((await post(fromEnv, "bearer sk-env")).status).toBe(200);
  });

  it("answers /health, /metrics, /ping and /version without a key", async () => {
    for (const path of ["/health", "/metrics", "/ping", "/version"]) {
      const res = await fetch(`${fromEnv.url}${path}`);
      expect(res.status, path).toBe(200);
    }
    const metrics = await (await fetch(`${fromEnv.url}/metrics`)).text();
    expect(metrics).toContain("vllm:num_requests_running");
  });

  it("takes --api-key over VLLM_API_KEY", async () => {
    await expectServed(cliWins, "sk-cli");
    await expectUnauthorized(await post(cliWins, "Bearer sk-env"));
  });

  it("serves either of two --api-key keys, and no other", async () => {
    await expectServed(twoKeys, "sk-one");
    await expectServed(twoKeys, "sk-two");
    await expectUnauthorized(await post(twoKeys, "Bearer sk-one sk-two"));
  });

  it("with an empty VLLM_API_KEY has no key and ignores any Authorization header", async () => {
    expect((await post(open)).status).toBe(200);
    expect((await post(open, "Bearer anything")).status).toBe(200);
  });
});
