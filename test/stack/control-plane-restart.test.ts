import { join } from "node:path";
import type OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { clientFor, createKey, type FastEdge, startEdgeMiniflare } from "../edge/helpers.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * kill -9 of the control plane under streamed load, then its restart: no
 * client request may fail, during either. The edge (workerd) keeps routing
 * on the endpoint set it has while the control plane is dead, and the
 * restarted control plane must not shrink that set before its agents are
 * back (docs/operating.md, "Restarts").
 *
 * The suite runs a short version (16 s of load, 3 s dead, an 8 s startup
 * grace); `LLMGW_RESTART_LOAD_FULL=1` runs the long one: 60 s of load,
 * 15 s dead, the default grace and lost_after (60 s). After 15 s dead an
 * agent's reconnect backoff may have grown to tens of seconds (full jitter,
 * up to 60 s), which is why the hold on the endpoint set lasts as long as
 * lost_after: a shorter one would drop replicas whose agents are merely late.
 */
const FULL = process.env.LLMGW_RESTART_LOAD_FULL === "1";
const LOAD_MS = FULL ? 60_000 : 16_000;
const KILL_AT_MS = FULL ? 5_000 : 3_000;
const DEAD_MS = FULL ? 15_000 : 3_000;
const GRACE = FULL ? "60s" : "8s";
const CONCURRENCY = 6;

interface Outcome {
  at: number;
  ok: boolean;
  error?: string;
  route?: string | null;
  chunks: number;
}

describe("control plane kill -9 and restart under streamed load (real processes)", () => {
  let edge: FastEdge;
  let cp: ControlPlaneHandle;
  const agents: Proc[] = [];
  let client: OpenAI;

  beforeAll(async () => {
    edge = await startEdgeMiniflare();
    cp = await startControlPlane(
      `
edge:
  url: ${edge.url}
  token_env: LLMGW_TEST_EDGE_TOKEN
control:
  startup_grace: ${GRACE}
  interval: 1s
  heartbeat_interval: 500ms
  port_range: [24600, 24699]
models:
  - name: steady
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/restart-steady
        engine_args: ["--max-model-len", "4096", "--sim-speed", "20"]
        replicas: { min: 2 }
        startup_deadline: 60s
        spread: true
`,
      { env: { LLMGW_TEST_EDGE_TOKEN: edge.token } },
    );
    for (const node of ["r1", "r2"]) {
      agents.push(
        startAgent(cp, node, {
          gpus: "1xH100-80GB",
          extra: ["--vllm-bin", "test/bin/vllm", "--stable-after", "1s"],
        }),
      );
    }
    const key = await createKey(edge, { band: "gold" });
    client = clientFor(edge, key.secret);
    await waitUntil(
      "two replicas ready",
      async () => (await cp.client.listReplicas({})).replicas.filter((r) => r.state === "ready").length === 2,
      90_000,
    );
    // Both endpoints at the edge: the first request after publication succeeds.
    await waitUntil(
      "both endpoints at the edge",
      async () => (await edge.sync.getPoolStatus({ model: "steady" })).pools[0]?.endpoints.length === 2,
      30_000,
      100,
    );
    await waitUntil("a request through the edge", async () => {
      const r = await client.chat.completions.create({
        model: "steady",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 1,
      });
      return r.choices.length === 1;
    });
  }, 150_000);

  afterAll(async () => {
    await Promise.all(agents.map((a) => a.kill()));
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
    await edge?.stop();
  });

  it(
    `serves every streamed request through a kill -9 and a restart (${LOAD_MS / 1000} s of load)`,
    async () => {
      const t0 = Date.now();
      const outcomes: Outcome[] = [];
      let stop = false;
      const worker = async (w: number) => {
        for (let i = 0; !stop; i++) {
          const at = Date.now() - t0;
          let chunks = 0;
          try {
            const { data, response } = await client.chat.completions
              .create({
                model: "steady",
                messages: [{ role: "user", content: `worker ${w} request ${i}` }],
                max_tokens: 24,
                stream: true,
              })
              .withResponse();
            for await (const c of data) if (c.choices[0]?.delta?.content) chunks++;
            outcomes.push({ at, ok: chunks > 0, chunks, route: response.headers.get("x-llmgw-route") });
          } catch (err) {
            outcomes.push({ at, ok: false, chunks, error: String(err) });
          }
        }
      };
      const load = Promise.all(Array.from({ length: CONCURRENCY }, (_, w) => worker(w)));

      await new Promise((r) => setTimeout(r, KILL_AT_MS));
      const killedAt = Date.now() - t0;
      cp.proc.child.kill("SIGKILL");
      await cp.proc.exited;
      await new Promise((r) => setTimeout(r, DEAD_MS));
      const restartAt = Date.now() - t0;
      await cp.restart();
      const restarted = cp.proc;
      await waitUntil(
        "both agents back",
        async () => (await cp.nodes()).filter((n) => n.connected && n.state === "ready").length === 2,
        90_000,
        100,
      );
      const backAt = Date.now() - t0;
      await new Promise((r) => setTimeout(r, Math.max(0, LOAD_MS - (Date.now() - t0))));
      stop = true;
      await load;

      const failed = outcomes.filter((o) => !o.ok);
      const published = [
        ...restarted.output().matchAll(/endpoint set published to the edge.*"endpoints":(\d+)/g),
      ].map((m) => Number(m[1]));
      const phase = (from: number, to: number) => outcomes.filter((o) => o.at >= from && o.at < to).length;
      const routes: Record<string, number> = {};
      for (const o of outcomes) routes[o.route ?? "none"] = (routes[o.route ?? "none"] ?? 0) + 1;
      // The figures for the report: how much load each phase carried.
      console.log(
        JSON.stringify({
          loadMs: LOAD_MS,
          requests: outcomes.length,
          failed: failed.length,
          beforeKill: phase(0, killedAt),
          whileDead: phase(killedAt, restartAt),
          afterRestart: phase(restartAt, LOAD_MS + 60_000),
          agentsBackMsAfterRestart: backAt - restartAt,
          publishedAfterRestart: published,
          routes,
        }),
      );
      expect(failed.slice(0, 5)).toEqual([]);
      expect(phase(killedAt, restartAt)).toBeGreaterThan(0);
      expect(phase(restartAt, LOAD_MS + 60_000)).toBeGreaterThan(0);

      // The restarted control plane never gave the edge fewer endpoints.
      expect(published.every((n) => n === 2)).toBe(true);
    },
    LOAD_MS + 120_000,
  );
});
