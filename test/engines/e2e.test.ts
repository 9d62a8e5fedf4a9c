import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type ControlPlaneHandle,
  engineKeyOf,
  killProcessesMatching,
  loopbackAddress,
  processArgv,
  processRunning,
  startAgent,
  startControlPlane,
} from "../harness/fleet.ts";
import { freePort, type Proc, waitUntil } from "../harness/process.ts";
import { parseExposition, sampleValue } from "../harness/prometheus.ts";

// The whole engine path with real processes: control plane → agent →
// vLLM adapter → `test/bin/vllm` (the sim engine behind vLLM's command
// line) → a client talking to the engine directly. A tag unique to this run
// is part of both model sources, so every engine this file started can be
// found in /proc and killed at the end, whatever state the agents left.
const TAG = randomUUID().slice(0, 8);
const CHAT_SOURCE = `sim-org/e2e-chat-${TAG}`;
const STUCK_SOURCE = `sim-org/e2e-stuck-${TAG}`;
const CHAT = "e2e-chat/1gpu/0";
const NODE = "e2e-node";
// The harness gives each simulated node its own loopback address.
const HOST = loopbackAddress(NODE);
const STUCK = "e2e-stuck/1gpu/0";

// --sim-slow-token-ms makes every output token take 40 ms of real time, so a
// long stream stays in flight long enough to be seen in the scraped load,
// while short requests still finish in well under a second.
const CONFIG = `
control:
  interval: 1s
  unreachable_after: 10s
  lost_after: 30s
  startup_grace: 1s
  heartbeat_interval: 300ms
models:
  - name: e2e-chat
    profiles:
      - name: 1gpu
        engine: vllm
        source: ${CHAT_SOURCE}
        engine_args: ["--max-model-len", "8192", "--sim-speed", "10", "--sim-slow-token-ms", "40"]
        startup_deadline: 45s
        stop_grace: 2s
  - name: e2e-stuck
    profiles:
      - name: 1gpu
        engine: vllm
        source: ${STUCK_SOURCE}
        engine_args: ["--max-model-len", "8192", "--sim-startup-seconds", "3600"]
        startup_deadline: 3s
        stop_grace: 1s
`;

// Short agent-local restart backoff and orphan grace (hidden agent flags):
// the defaults (10 s doubling, 60 s) are the same code with other numbers.
const AGENT_EXTRA = [
  "--vllm-bin",
  "test/bin/vllm",
  "--stable-after",
  "1s",
  "--scrape-interval",
  "300ms",
  "--restart-backoff",
  "1500ms",
  "--restart-max-backoff",
  "3s",
  "--orphan-grace",
  "3s",
];

interface ShardJson {
  rank: number;
  node: string;
  state: string;
  gpus: number[];
  ports: { http: number; distInit: number[] };
  pid: number | null;
  load: {
    waiting: number;
    running: number;
    kvUsage: number;
    prefixCacheHitRate: number;
    scrapedAt: string | null;
  } | null;
}

interface ReplicaJson {
  id: string;
  model: string;
  state: string;
  restarts: number;
  shards: ShardJson[];
  lastFailure: { reason: string; exitCode: number | null; outputTail: string[]; at: string | null } | null;
}

describe("an engine through the agent: vLLM adapter, readiness, load, adoption, restart, startup deadline", () => {
  let cp: ControlPlaneHandle;
  let agent: Proc;
  let stateDir: string;
  let engineUrl = "";
  let pid = 0;

  async function replicas(): Promise<ReplicaJson[]> {
    return cp.replicas();
  }

  async function replica(id: string): Promise<ReplicaJson | undefined> {
    return (await replicas()).find((r) => r.id === id);
  }

  function client(): OpenAI {
    // Past the edge, as only a test does: with the key the agent launched the engine with.
    const apiKey = engineKeyOf(stateDir, CHAT);
    return new OpenAI({ baseURL: `${engineUrl}/v1`, apiKey, maxRetries: 0, timeout: 20_000 });
  }

  /** The agent's own /metrics, on a port of its own for each start (startWatchedAgent). */
  let agentMetricsUrl = "";

  async function startWatchedAgent(): Promise<Proc> {
    const port = await freePort();
    agentMetricsUrl = `http://127.0.0.1:${port}/metrics`;
    const extra = [...AGENT_EXTRA, "--metrics-listen", `127.0.0.1:${port}`];
    return startAgent(cp, NODE, { gpus: "2xH100-80GB", stateDir, extra });
  }

  /** One sample of the agent's metrics; undefined while it does not answer. */
  async function agentMetric(name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
    const text = await fetch(agentMetricsUrl).then(
      (r) => r.text(),
      () => "",
    );
    return sampleValue(parseExposition(text), name, labels);
  }

  /** Until the agent's orphan grace is over; then no adopted engine may have been stopped by it. */
  async function orphanGraceOver(): Promise<void> {
    await waitUntil(
      "the orphan grace over",
      async () => (await agentMetric("llmgw_agent_orphan_grace", { state: "over" })) === 1,
    );
    expect(await agentMetric("llmgw_agent_orphans_stopped_total")).toBe(0);
  }

  async function chat(maxTokens = 8): Promise<string> {
    const res = await client().chat.completions.create({
      model: "e2e-chat",
      messages: [{ role: "user", content: "Say something." }],
      max_tokens: maxTokens,
    });
    return res.choices[0]?.message.content ?? "";
  }

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    stateDir = join(cp.dir, "agents", NODE);
    agent = startAgent(cp, NODE, { gpus: "2xH100-80GB", stateDir, extra: AGENT_EXTRA });
  });

  afterAll(async () => {
    // The agent first (SIGKILL: it must not restart anything meanwhile), then
    // every engine this file started, by the tag in their command lines.
    agent?.child.kill("SIGKILL");
    await agent?.exited;
    await cp?.proc.kill();
    await waitUntil("no engine of this file left", () => killProcessesMatching(TAG).length === 0, 10_000);
  });

  it("places the replica, launches it through the vLLM adapter, serves a streaming chat and reports its load", async () => {
    const ready = await waitUntil(
      "e2e-chat ready with a PID",
      async () => {
        const r = await replica(CHAT);
        return r?.state === "ready" && r.shards[0]?.pid ? r : undefined;
      },
      45_000,
      250,
    );
    const shard = ready.shards[0]!;
    expect(shard.node).toBe(NODE);
    expect(shard.gpus).toHaveLength(1);
    expect(shard.ports.http).toBeGreaterThanOrEqual(cp.enginePorts[0]);
    expect(shard.ports.http).toBeLessThanOrEqual(cp.enginePorts[1]);
    expect(ready.restarts).toBe(0);
    pid = shard.pid!;
    engineUrl = `http://${HOST}:${shard.ports.http}`;

    // What the engine actually runs: the shim execs the sim engine, so the
    // PID is the engine's and its argv is the adapter's vLLM command line.
    const argv = processArgv(pid);
    expect(argv).not.toBeNull();
    const serve = argv!.indexOf("serve");
    expect(serve).toBeGreaterThan(0);
    expect(argv!.slice(serve)).toEqual([
      "serve",
      CHAT_SOURCE,
      "--host",
      HOST,
      "--port",
      String(shard.ports.http),
      "--served-model-name",
      "e2e-chat",
      "--tensor-parallel-size",
      "1",
      "--pipeline-parallel-size",
      "1",
      "--gpu-memory-utilization",
      "0.9",
      "--max-model-len",
      "8192",
      "--sim-speed",
      "10",
      "--sim-slow-token-ms",
      "40",
    ]);
    // The agent's environment rules reached the process.
    const env = readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");
    expect(env).toContain(`CUDA_VISIBLE_DEVICES=${shard.gpus.join(",")}`);
    expect(env).toContain("CUDA_DEVICE_ORDER=PCI_BUS_ID");

    // A streaming chat completion, called directly on the engine with the
    // official client.
    const stream = await client().chat.completions.create({
      model: "e2e-chat",
      messages: [{ role: "user", content: "Tell me about GPUs." }],
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(finish).toBe("length");
    expect(usage?.completion_tokens).toBe(12);

    // Load, scraped by the agent and carried up the stream: a slow stream in
    // flight shows as running > 0 in ctl replicas --json.
    const controller = new AbortController();
    const slow = client()
      .chat.completions.create(
        {
          model: "e2e-chat",
          messages: [{ role: "user", content: "A long answer, please." }],
          // 160 s of tokens, aborted as soon as it has been seen: on a loaded
          // machine each ctl call below can take seconds, and 400 (16 s) once
          // ran out before ctl showed it.
          max_tokens: 4000,
          stream: true,
        },
        { signal: controller.signal },
      )
      .then(async (s) => {
        for await (const _ of s) {
          // drain until aborted
        }
      })
      .catch(() => undefined);
    const busy = await waitUntil(
      "running > 0 in the replica's load",
      async () => {
        const load = (await replica(CHAT))?.shards[0]?.load;
        return load && load.running + load.waiting > 0 ? load : undefined;
      },
      15_000,
      200,
    );
    expect(busy.running).toBeGreaterThanOrEqual(1);
    // As an operator sees it, while the stream is still in flight (a load
    // report may land between the two reads, so ctl is asked until it shows).
    await waitUntil("running > 0 in ctl replicas --json", async () => {
      const ctl = await cp.ctl("replicas", "--json");
      const shown = (JSON.parse(ctl.stdout) as ReplicaJson[]).find((r) => r.id === CHAT)?.shards[0]?.load;
      return (shown?.running ?? 0) >= 1;
    });
    expect(Number.isNaN(Date.parse(busy.scrapedAt ?? ""))).toBe(false);
    expect(busy.kvUsage).toBeGreaterThan(0);
    controller.abort();
    await slow;
    await waitUntil(
      "load back to idle",
      async () => {
        const load = (await replica(CHAT))?.shards[0]?.load;
        return load && load.running + load.waiting === 0;
      },
      15_000,
      200,
    );
  });

  it("an engine that never becomes healthy fails as a startup failure after its deadline", async () => {
    // Placed alongside the first model from the start; by now its 3 s
    // deadline has long passed at least once.
    const failed = await waitUntil(
      "e2e-stuck failed its startup deadline",
      async () => {
        const r = await replica(STUCK);
        return r?.lastFailure ? r : undefined;
      },
      30_000,
      250,
    );
    expect(failed.state).not.toBe("ready");
    expect(failed.lastFailure!.reason).toMatch(/not healthy within the startup deadline of 3s/);
    // The agent restarts it itself (single-node), so it says what happens next.
    expect(failed.lastFailure!.reason).toMatch(/restart \d+ in \d/);
    // The engine's own output comes with the failure. (On a loaded machine the
    // first attempt may hit its 3 s deadline before the engine printed a line;
    // a later one will have.)
    await waitUntil(
      "a startup failure with the engine's output tail",
      async () =>
        /sim engine listening/.test((await replica(STUCK))?.lastFailure?.outputTail.join("\n") ?? ""),
      40_000,
      250,
    );
    expect(agent.output()).toMatch(/"replica":"e2e-stuck\/1gpu\/0","state":"failed_startup"/);
    // It never got in the way of the healthy model on the other GPU.
    const chat = (await replica(CHAT))!;
    expect(chat.state).toBe("ready");
    expect(chat.shards[0]!.gpus).not.toEqual(failed.shards[0]?.gpus);
  });

  it("kill -9 of the engine: the failure carries exit code 137 and the output tail; restarted after the backoff", async () => {
    const killedAt = Date.now();
    process.kill(pid, "SIGKILL");
    const restarted = await waitUntil(
      "a new engine PID, ready",
      async () => {
        const r = await replica(CHAT);
        const s = r?.shards[0];
        return r?.state === "ready" && s?.pid && s.pid !== pid ? r : undefined;
      },
      30_000,
      200,
    );
    // The backoff (1.5 s here) was waited out before the relaunch.
    expect(Date.now() - killedAt).toBeGreaterThanOrEqual(1_500);
    const f = restarted.lastFailure!;
    expect(f.exitCode).toBe(137);
    expect(f.reason).toMatch(/killed by SIGKILL \(exit code 137\); restart 1 in 1\.5s/);
    expect(f.outputTail.length).toBeGreaterThan(0);
    expect(f.outputTail.join("\n")).toMatch(/sim engine ready/);
    // Restarted by the agent, not re-placed by the control plane.
    expect(restarted.restarts).toBe(0);
    expect(processRunning(pid)).toBe(false);
    pid = restarted.shards[0]!.pid!;
    expect(processArgv(pid)).toContain(CHAT_SOURCE);
    expect((await chat()).length).toBeGreaterThan(0);
  });

  it("kill -9 of the agent: the engine keeps serving; a restarted agent re-adopts it without a restart", async () => {
    // A stream in flight when the agent dies finishes regardless.
    let streaming = () => {};
    const firstToken = new Promise<void>((resolve) => {
      streaming = resolve;
    });
    const inFlight = client()
      .chat.completions.create({
        model: "e2e-chat",
        messages: [{ role: "user", content: "Keep going." }],
        max_tokens: 40,
        stream: true,
      })
      .then(
        async (s) => {
          let finish: string | null | undefined;
          for await (const c of s) {
            streaming();
            finish = c.choices[0]?.finish_reason ?? finish;
          }
          return finish;
        },
        (err: unknown) => err,
      );
    await firstToken;
    const oldInstance = (await cp.nodes()).find((n) => n.name === NODE)?.agentInstance;
    agent.child.kill("SIGKILL");
    await agent.exited;
    // It ran to its length although its agent died after the first tokens.
    expect(await inFlight).toBe("length");
    expect(processRunning(pid)).toBe(true);
    expect((await chat()).length).toBeGreaterThan(0);

    const before = (await replica(CHAT))!;
    agent = await startWatchedAgent();
    // A new agent registers only once it has adopted what the state file lists.
    await waitUntil(
      "node ready with the new agent",
      async () =>
        (await cp.nodes()).find(
          (n) => n.name === NODE && n.agentInstance !== oldInstance && n.connected && n.state === "ready",
        ),
      20_000,
      200,
    );
    // Past the orphan grace (3 s here), as the agent's metrics say: the
    // control plane's claim kept the engine; an unclaimed one would have
    // been stopped.
    await orphanGraceOver();
    const after = (await replica(CHAT))!;
    expect(after.state).toBe("ready");
    expect(after.shards[0]!.pid).toBe(pid);
    expect(after.restarts).toBe(before.restarts);
    expect(after.restarts).toBe(0);
    expect(processRunning(pid)).toBe(true);
    expect(agent.output()).not.toMatch(
      /"replica":"e2e-chat\/1gpu\/0","state":"(stopped|failed_running|starting)"/,
    );
    expect(agent.output()).not.toMatch(/cannot adopt shard/);
    // Still supervised: load keeps coming from the adopted engine.
    const seen = Date.parse(after.shards[0]!.load?.scrapedAt ?? "");
    await waitUntil(
      "a fresh load scrape from the adopted engine",
      async () => {
        const at = Date.parse((await replica(CHAT))?.shards[0]?.load?.scrapedAt ?? "");
        return at > seen;
      },
      10_000,
      200,
    );
    expect((await chat()).length).toBeGreaterThan(0);
  });
  it("kill -9 of the agent and the control plane together: both come back, the engine is adopted and claimed, not restarted", async () => {
    agent.child.kill("SIGKILL");
    await agent.exited;
    cp.proc.child.kill("SIGKILL");
    await cp.proc.exited;
    // The agent comes back first and adopts with no control plane to tell it
    // anything; its orphan clock starts only once a control plane accepts its
    // Register, and that control plane (with an empty table) must claim it.
    agent = await startWatchedAgent();
    // Adopted, and ready: e2e-stuck's engine, adopted too when it was starting, never is.
    await waitUntil("the engine adopted", async () => {
      const adopted = await agentMetric("llmgw_agent_engines_adopted_total");
      const ready = await agentMetric("llmgw_agent_engines", { state: "ready" });
      return adopted !== undefined && adopted >= 1 && ready === 1;
    });
    expect((await chat()).length).toBeGreaterThan(0);
    await cp.restart();
    await waitUntil(
      "e2e-chat adopted by the new control plane",
      async () => {
        const r = await replica(CHAT);
        return r?.state === "ready" && r.shards[0]?.pid === pid;
      },
      30_000,
      250,
    );
    // Past the orphan grace, which started at that registration.
    await orphanGraceOver();
    const after = (await replica(CHAT))!;
    expect(after.state).toBe("ready");
    expect(after.shards[0]!.pid).toBe(pid);
    expect(processRunning(pid)).toBe(true);
    expect(agent.output()).not.toMatch(/orphan: not claimed/);
    expect((await chat()).length).toBeGreaterThan(0);
  });
});
