import { appendFileSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import {
  type ControlPlaneHandle,
  engineKeyOf,
  loopbackAddress,
  startAgent,
  startControlPlane,
} from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * Scaling with real processes, driven as an operator and a client would:
 * the control plane, one agent per 1-GPU node, sim engines through the vLLM
 * adapter. No edge here: the demand comes from the agents' scrapes alone
 * (and `ctl explain` says the edge is missing). Each engine runs two
 * sequences at a time at 40 ms a token, so a dozen clients make a queue.
 */
const CONFIG = `
control:
  interval: 1s
  startup_grace: 1s
  heartbeat_interval: 300ms
router:
  scrape_interval: 500ms
scaling:
  target_saturation: 0.5
  tolerance: 0.2
  window: 4s
  scale_up_cooldown: 2s
  scale_down_cooldown: 6s
`;
const ENGINE = `["--max-model-len", "4096", "--max-num-seqs", "2", "--sim-slow-token-ms", "40"]`;
const MODELS = `
models:
  - name: tiny
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/tiny
        engine_args: ${ENGINE}
        replicas: { min: 1, max: 3 }
        startup_deadline: 60s
        stop_grace: 30s
  - name: vip
    priority: 10
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/vip
        engine_args: ${ENGINE}
        replicas: { min: 1, max: 2 }
        startup_deadline: 60s
  - name: floor
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/floor
        engine_args: ${ENGINE}
        replicas: { min: 1, max: 1 }
        startup_deadline: 60s
`;

type Replica = Awaited<ReturnType<ControlPlaneHandle["replicas"]>>[number];

describe("scaling (real processes)", () => {
  let cp: ControlPlaneHandle;
  const agents: Proc[] = [];

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    const extra = ["--vllm-bin", "test/bin/vllm"];
    for (const n of ["s1", "s2", "s3", "s4", "s5"])
      agents.push(startAgent(cp, n, { gpus: "1xH100-80GB", extra }));
    await waitUntil(
      "five nodes",
      async () => (await cp.nodes()).filter((n) => n.state === "ready").length === 5,
    );
    appendFileSync(cp.configPath, MODELS);
    cp.proc.child.kill("SIGHUP");
  }, 60_000);

  afterAll(async () => {
    await Promise.all(agents.map((a) => a.kill()));
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  const replicasOf = async (model: string) => (await cp.replicas()).filter((r) => r.model === model);
  const readyOf = async (model: string) => (await replicasOf(model)).filter((r) => r.state === "ready");
  const client = (r: Replica) =>
    new OpenAI({
      baseURL: `http://${loopbackAddress(r.shards[0]!.node)}:${r.shards[0]!.ports.http}/v1`,
      // Straight to the engine, past the edge: with the key its agent launched it with.
      apiKey: engineKeyOf(join(cp.dir, "agents", r.shards[0]!.node), r.id),
      maxRetries: 0,
    });
  /** One streamed chat of exactly `tokens` tokens; what came back. */
  async function chat(r: Replica, tokens: number) {
    const body = {
      model: r.model,
      messages: [{ role: "user" as const, content: "Tell me a story" }],
      max_tokens: tokens,
      stream: true as const,
      stream_options: { include_usage: true },
      // vLLM's extension: exactly max_tokens, whatever the text.
      ignore_eos: true,
    };
    const stream = await client(r).chat.completions.create(body);
    let finish: string | null = null;
    let completion = 0;
    for await (const c of stream) {
      finish = c.choices[0]?.finish_reason ?? finish;
      if (c.usage) completion = c.usage.completion_tokens;
    }
    return { finish, completion };
  }
  /** `workers` clients in closed loop on one replica until `stop` resolves. */
  function load(r: Replica, workers: number, stop: Promise<unknown>) {
    let done = false;
    void stop.then(() => {
      done = true;
    });
    return Promise.all(
      Array.from({ length: workers }, async () => {
        while (!done) await chat(r, 20);
      }),
    );
  }

  it("grows a loaded model, then drains it back to min without cutting a request", async () => {
    const [first] = await waitUntil("tiny ready", async () => {
      const rs = await readyOf("tiny");
      return rs.length === 1 ? rs : undefined;
    });
    // Before any load: min, and the reason says the edge is missing.
    const quiet = await cp.ctl("explain", "tiny");
    expect(quiet.stdout).toContain("scaling: 1 replica(s) wanted");
    expect(quiet.stdout).toContain("edge: no edge link");

    let release!: () => void;
    const stop = new Promise<void>((r) => {
      release = r;
    });
    const loaded = load(first!, 12, stop);
    let grown: Replica[];
    let explained: string;
    try {
      grown = await waitUntil(
        "tiny at two ready replicas or more",
        async () => {
          const rs = await readyOf("tiny");
          return rs.length >= 2 ? rs : undefined;
        },
        60_000,
        250,
      );
      explained = (await cp.ctl("explain", "tiny")).stdout;
    } finally {
      release();
    }
    await loaded;
    expect(explained).toMatch(/last decision: up [12] → [23] at \S+ \(\d+s ago\): demand/);
    expect(explained).toMatch(/agents: \d of \d ready replica\(s\) scraped, waiting/);
    expect(await cp.metric('llmgw_scaling_events_total{model="tiny",direction="up"}')).toBeGreaterThanOrEqual(
      1,
    );

    // One long answer (400 tokens, 16 s) on every ready replica while demand
    // falls away: the scale-down drains, so each runs to its last token,
    // including those on a replica that was draining while they streamed.
    const ready = await readyOf("tiny");
    expect(ready.length).toBeGreaterThanOrEqual(2);
    expect(grown!.length).toBeGreaterThanOrEqual(2);
    const streaming = new Set(ready.map((r) => r.id));
    const long = ready.map(async (r) => {
      const answer = await chat(r, 400);
      streaming.delete(r.id);
      return answer;
    });
    const drainedWhileStreaming = new Set<string>();
    await waitUntil(
      "tiny back at one ready replica, nothing else left",
      async () => {
        const rs = await replicasOf("tiny");
        for (const r of rs) if (r.state !== "ready" && streaming.has(r.id)) drainedWhileStreaming.add(r.id);
        return rs.length === 1 && rs[0]!.state === "ready";
      },
      90_000,
      100,
    );
    expect(drainedWhileStreaming.size).toBeGreaterThanOrEqual(1);
    const answers = await Promise.all(long);
    expect(answers).toEqual(ready.map(() => ({ finish: "length", completion: 400 })));
    expect(cp.proc.output()).toMatch(/stop tiny\/1gpu\/\d: scale down: tiny\/1gpu wants \d replica\(s\)/);
    expect(
      await cp.metric('llmgw_scaling_events_total{model="tiny",direction="down"}'),
    ).toBeGreaterThanOrEqual(1);
    expect(cp.proc.output()).toMatch(/scale down/);
    expect((await cp.ctl("explain", "tiny")).stdout).toMatch(/last decision: down \d → 1/);
  }, 180_000);

  it("a higher priority never takes a lower model below its min: its extra replica waits", async () => {
    // Five GPUs: tiny and floor at their min of 1, vip at 1. Cordoning the
    // two free nodes leaves no GPU for vip's second replica but theirs.
    const busy = new Set((await cp.replicas()).flatMap((r) => r.shards.map((s) => s.node)));
    const free = ["s1", "s2", "s3", "s4", "s5"].filter((n) => !busy.has(n));
    for (const n of free) await cp.ctl("cordon", n);
    const [vip] = await waitUntil("vip ready", async () => {
      const rs = await readyOf("vip");
      return rs.length === 1 ? rs : undefined;
    });
    let release!: () => void;
    const stop = new Promise<void>((r) => {
      release = r;
    });
    const loaded = load(vip!, 12, stop);
    let explained: string;
    try {
      explained = await waitUntil(
        "vip wants 2 and says why it waits",
        async () => {
          const out = (await cp.ctl("explain", "vip")).stdout;
          return /scaling: 2 replica\(s\) wanted/.test(out) && /0\/5 nodes can host vip\/1gpu/.test(out)
            ? out
            : undefined;
        },
        60_000,
        250,
      );
    } finally {
      release();
    }
    await loaded;
    expect(explained).toContain("2 cordoned");
    // tiny and floor are at their min: both keep their one ready replica.
    expect((await readyOf("tiny")).length).toBe(1);
    expect((await readyOf("floor")).length).toBe(1);
    expect(await cp.metric('llmgw_scaling_desired_replicas{model="tiny"}')).toBe(1);
    for (const n of free) await cp.ctl("uncordon", n);
  }, 120_000);
});
