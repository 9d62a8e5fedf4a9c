import { join } from "node:path";
import type OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { clientFor, createKey, type Edge, startEdge } from "../edge/helpers.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * The whole product on loopback, as `npm start` runs it: the edge in
 * workerd, a control plane that places replicas and publishes them to the
 * edge, an agent whose engines are sim engines launched through the vLLM
 * adapter, and the official openai client calling the edge.
 */
describe("the whole stack: client → edge → placed replica", () => {
  let edge: Edge;
  let cp: ControlPlaneHandle;
  let agent: Proc;
  let client: OpenAI;

  beforeAll(async () => {
    edge = await startEdge();
    cp = await startControlPlane(
      `
edge:
  url: ${edge.url}
  token_env: LLMGW_TEST_EDGE_TOKEN
control:
  startup_grace: 1s
  interval: 1s
models:
  - name: llama-3.1-8b-instruct
    aliases: [llama-8b]
    profiles:
      - name: 1gpu
        engine: vllm
        source: meta-llama/Llama-3.1-8B-Instruct
        engine_args: ["--max-model-len", "8192", "--sim-speed", "50"]
        replicas: { min: 2 }
        startup_deadline: 60s
`,
      { env: { LLMGW_TEST_EDGE_TOKEN: edge.token } },
    );
    agent = startAgent(cp, "stack-1", { gpus: "2xH100-80GB", extra: ["--vllm-bin", "test/bin/vllm"] });
    const key = await createKey(edge, { band: "gold" });
    client = clientFor(edge, key.secret);
  }, 120_000);

  /** The endpoints the model's pool at the edge routes to now. */
  const atEdge = async () =>
    (await edge.sync.getPoolStatus({ model: "llama-3.1-8b-instruct" })).pools[0]?.endpoints.map(
      (e) => e.id,
    ) ?? [];

  afterAll(async () => {
    await agent?.kill();
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
    await edge?.stop();
  });

  it("serves chat through the edge from replicas the control plane placed and published", async () => {
    await waitUntil("both replicas at the edge", async () => (await atEdge()).length === 2, 60_000, 250);
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toContain("llama-3.1-8b-instruct");

    const { data, response } = await client.chat.completions
      .create({ model: "llama-8b", messages: [{ role: "user", content: "Hello there" }], max_tokens: 8 })
      .withResponse();
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(data.usage?.completion_tokens).toBe(8);
    expect(response.headers.get("x-llmgw-endpoint")).toMatch(/^llama-3\.1-8b-instruct\/1gpu\/[01]$/);

    const stream = await client.chat.completions.create({
      model: "llama-3.1-8b-instruct",
      messages: [{ role: "user", content: "Stream, please" }],
      max_tokens: 6,
      stream: true,
    });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    expect(text.length).toBeGreaterThan(0);
  });

  it("takes a replica out of the edge's endpoint set when it stops being ready", async () => {
    const list = JSON.parse((await cp.ctl("replicas", "--json")).stdout) as {
      id: string;
      shards: { pid: number }[];
    }[];
    const victim = list[0]!;
    process.kill(victim.shards[0]!.pid, "SIGKILL");
    // The agent reports the failure; the next publish drops the replica…
    await waitUntil(
      "the replica gone from the edge",
      async () => !(await atEdge()).includes(victim.id),
      30_000,
      100,
    );
    // …and the agent's restart brings it back.
    await waitUntil(
      "the replica back at the edge",
      async () => (await atEdge()).includes(victim.id),
      60_000,
      250,
    );
    const r = await client.chat.completions.create({
      model: "llama-8b",
      messages: [{ role: "user", content: "still there?" }],
      max_tokens: 3,
    });
    expect(r.choices).toHaveLength(1);
  });
});
