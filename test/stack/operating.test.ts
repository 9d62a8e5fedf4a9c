import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clientFor, createKey, type Edge } from "../edge/helpers.ts";
import type { ControlPlaneHandle } from "../harness/fleet.ts";
import { type LinkedStack, startLinkedStack } from "../harness/linked-stack.ts";
import { freePort, LLMGW, REPO, runLlmgw, waitUntil } from "../harness/process.ts";
import {
  type DocumentedMetric,
  documentedMetrics,
  type Family,
  parseExposition,
  sampleValue,
} from "../harness/prometheus.ts";

/**
 * What an operator looks at, on the real stack: an edge in workerd, a
 * control plane placing a model on an agent's simulated GPUs (sim engines
 * through the vLLM adapter) and a model that cannot fit, and requests
 * through the edge with the openai client.
 */
const ADMIN_TOKEN = "operating-test-admin-token";
const MODEL = "op-small";
const TOO_BIG = "op-huge";

describe("operating the stack", () => {
  let edge: Edge;
  let cp: ControlPlaneHandle;
  let agentMetricsUrl: string;
  let stack: LinkedStack | undefined;

  beforeAll(async () => {
    const metricsPort = await freePort();
    agentMetricsUrl = `http://127.0.0.1:${metricsPort}/metrics`;
    stack = await startLinkedStack({
      tag: "edge-operating",
      adminToken: ADMIN_TOKEN,
      models: `  - name: ${MODEL}
    profiles:
      - name: 1gpu
        engine: vllm
        source: test/op-small
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50", "--max-num-seqs", "24"]
        replicas: { min: 1 }
        startup_deadline: 60s
  - name: ${TOO_BIG}
    profiles:
      - name: tp8
        engine: vllm
        source: test/op-huge
        tensor_parallel: 8
        replicas: { min: 1 }
`,
      node: "op-1",
      agent: { gpus: "2xH100-80GB", extra: ["--metrics-listen", `127.0.0.1:${metricsPort}`] },
      routed: MODEL,
    });
    ({ edge, cp } = stack);
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
  });

  it("counts the engines' generated tokens per second per model in the edge view's history", async () => {
    const key = await createKey(edge, { band: "gold" });
    const openai = clientFor(edge, key.secret);
    await waitUntil("a sample with tokens per second above 0", async () => {
      await openai.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: "Count to ten." }],
        max_tokens: 32,
      });
      const s = await cp.client.getEdgeStatus({ model: MODEL });
      return (s.models[0]?.history ?? []).some((h) => h.generatedTokensPerSecond > 0);
    });
  }, 60_000);

  it("the engine's capacity reaches the edge's pool: its batch from its arguments, its KV tokens from its /metrics", async () => {
    const endpoint = async () => {
      const { pools } = await edge.sync.getPoolStatus({ model: MODEL });
      return pools[0]?.endpoints[0];
    };
    await waitUntil("capacity in the pool's endpoint", async () => ((await endpoint())?.kvTokens ?? 0n) > 0n);
    const e = (await endpoint())!;
    expect(e.maxNumSeqs).toBe(24);
    const metrics = await (await fetch(`${e.url}/metrics`)).text();
    const info = /vllm:cache_config_info\{[^}]*\}/.exec(metrics)?.[0] ?? "";
    const label = (name: string) => Number(new RegExp(`${name}="(\\d+)"`).exec(info)?.[1]);
    expect(e.kvTokens).toBe(BigInt(label("num_gpu_blocks") * label("block_size")));
    const shown = await runLlmgw(["ctl", "endpoints", "status", MODEL, "--edge", edge.url], {
      LLMGW_EDGE_TOKEN: edge.token,
    });
    expect(shown.stdout).toContain(`24 seqs, ${Number(e.kvTokens).toLocaleString("en-US")} tokens`);
  }, 60_000);

  it("ctl status: nodes, replicas, models with why one cannot run, and the edge's view", async () => {
    const r = await cp.ctl("status");
    expect(r.code).toBe(0);
    const out = r.stdout;
    for (const section of ["NODES", "REPLICAS", "MODELS", `EDGE ${edge.url}: polled`])
      expect(out).toContain(section);
    expect(out).toMatch(/op-1\s+ready/);
    expect(out).toMatch(new RegExp(`${MODEL}/1gpu/0\\s+ready`));
    expect(out).toMatch(new RegExp(`${MODEL}\\s.*1/1`));
    // The words `ctl explain` uses, for the model that cannot run.
    const explain = await cp.client.explain({ model: TOO_BIG });
    expect(out).toContain(`${TOO_BIG}: 0/1 ready`);
    expect(out).toContain(explain.lines[0]);
    // The edge's pool: its bands and its endpoint with the breaker.
    expect(out).toMatch(new RegExp(`${MODEL}: saturation [0-9.]+, load feed live`));
    expect(out).toMatch(/gold\s+\S+\s+\d+\s+\d+/);
    // In flight, with what it notes beside (prefilling streams, grants' slots set aside: "0 (+1 granted)").
    expect(out).toMatch(
      new RegExp(`${MODEL}/1gpu/0\\s+default\\s+0\\s+ready\\s+\\d+(?: \\([^)]*\\))?\\s+\\S+\\s+closed`),
    );

    const j = await cp.ctl("status", "--json");
    expect(j.code).toBe(0);
    const s = JSON.parse(j.stdout) as {
      nodes: { name: string; state: string }[];
      replicas: { id: string; state: string }[];
      models: { name: string; replicasReady: number; replicasDesired: number; cannotRun: string[] }[];
      edge: { configured: boolean; models: { model: string; pool: { bands: { name: string }[] } }[] };
    };
    expect(s.nodes.map((n) => [n.name, n.state])).toEqual([["op-1", "ready"]]);
    expect(s.replicas.find((x) => x.id === `${MODEL}/1gpu/0`)?.state).toBe("ready");
    const huge = s.models.find((m) => m.name === TOO_BIG)!;
    expect([huge.replicasReady, huge.replicasDesired, huge.cannotRun[0]]).toEqual([0, 1, explain.lines[0]]);
    expect(s.models.find((m) => m.name === MODEL)?.cannotRun).toEqual([]);
    expect(s.edge.configured).toBe(true);
    expect(s.edge.models.find((m) => m.model === MODEL)?.pool.bands.map((b) => b.name)).toContain("gold");
  }, 60_000);

  it("ctl status --watch redraws the screen in place until interrupted", async () => {
    const child = spawn(
      process.execPath,
      [LLMGW, "ctl", "status", "--watch", "--interval", "500ms", "--control-plane", cp.adminUrl],
      {
        cwd: REPO,
        env: { ...process.env, LLMGW_ADMIN_TOKEN: ADMIN_TOKEN },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    try {
      const frames = () => out.split("\x1b[H\x1b[J").slice(1);
      await waitUntil(
        "three complete frames",
        async () => frames().filter((f) => f.includes("EDGE ")).length >= 3,
      );
      for (const f of frames().slice(0, 3)) {
        expect(f).toMatch(/^every 0\.5s: llmgw ctl status/);
        expect(f).toContain("NODES");
        expect(f).toContain(`EDGE ${edge.url}`);
      }
    } finally {
      child.kill("SIGINT");
    }
    const code = await new Promise<number | null>((r) =>
      child.once("exit", (c, sig) => r(c ?? (sig ? 130 : null))),
    );
    expect(code).not.toBe(0);
  }, 60_000);

  it("ctl status with a wrong token says so and exits 3", async () => {
    const r = await runLlmgw(["ctl", "status", "--control-plane", cp.adminUrl], {
      LLMGW_ADMIN_TOKEN: "not-the-admin-token",
    });
    expect(r.code).toBe(3);
    expect(r.stderr).toContain("llmgw ctl status: the admin token is not valid for this control plane");
  }, 30_000);

  /** Every documented metric is exported with its type and exactly its labels; every llmgw_ one exported is documented. */
  function matchesDocs(families: Map<string, Family>, documented: DocumentedMetric[]) {
    for (const d of documented) {
      const f = families.get(d.name);
      if (!f) {
        if (!d.conditional) expect.fail(`${d.name} is documented but not exported`);
        continue;
      }
      expect(f.type, d.name).toBe(d.type);
      for (const s of f.samples) expect(Object.keys(s.labels).sort(), d.name).toEqual([...d.labels].sort());
    }
    const listed = new Set(documented.map((d) => d.name));
    for (const name of families.keys())
      if (name.startsWith("llmgw_")) expect(listed, `${name} is not documented`).toContain(name);
  }

  it("the control plane's /metrics is what docs/metrics.md lists, the edge's part included", async () => {
    const documented = [...documentedMetrics("Control plane")];
    expect(documented.some((d) => d.name.startsWith("llmgw_edge_"))).toBe(true);
    const families = parseExposition(await cp.metrics());
    matchesDocs(families, documented);
    // The edge's part has the model's figures: its bands and its one endpoint.
    const sample = (name: string, labels: Record<string, string> = {}) => sampleValue(families, name, labels);
    expect(sample("llmgw_edge_pool_up", { model: MODEL })).toBe(1);
    expect(sample("llmgw_edge_endpoints", { model: MODEL })).toBe(1);
    expect(sample("llmgw_edge_breakers", { model: MODEL, state: "closed" })).toBe(1);
    expect(sample("llmgw_edge_queue_depth", { model: MODEL, band: "gold" })).toBe(0);
    expect(
      sample("llmgw_edge_requests_total", { model: MODEL, band: "gold", outcome: "admitted" }),
    ).toBeGreaterThan(0);
    expect(sample("llmgw_edge_pool_calls_total", { model: MODEL })).toBeGreaterThan(0);
    expect(sample("llmgw_edge_status_age_seconds", {})).toBeLessThan(10);
  });

  it("the agent's /metrics (--metrics-listen) is what docs/metrics.md lists", async () => {
    const families = parseExposition(await (await fetch(agentMetricsUrl)).text());
    matchesDocs(families, documentedMetrics("Agent"));
    const value = (name: string, labels: Record<string, string> = {}) => sampleValue(families, name, labels);
    expect(value("llmgw_agent_engines", { state: "ready" })).toBe(1);
    expect(value("llmgw_agent_stream_connected")).toBe(1);
    expect(value("llmgw_agent_stream_messages_total", { direction: "sent", type: "register" })).toBe(1);
    expect(value("llmgw_agent_stream_messages_total", { direction: "received", type: "registerAck" })).toBe(
      1,
    );
    expect(value("llmgw_agent_stream_messages_total", { direction: "received", type: "startShard" })).toBe(1);
    expect(
      value("llmgw_agent_stream_messages_total", { direction: "sent", type: "shardLoad" }),
    ).toBeGreaterThan(0);
    expect(value("llmgw_agent_stream_reconnects_total")).toBe(0);
    expect(value("llmgw_agent_engine_restarts_total")).toBe(0);
    // A first start: nothing to adopt, and no orphan stopped; its grace began at registration.
    expect(value("llmgw_agent_engines_adopted_total")).toBe(0);
    expect(value("llmgw_agent_orphans_stopped_total")).toBe(0);
    expect(value("llmgw_agent_orphan_grace", { state: "not_begun" })).toBe(0);
  });
});
