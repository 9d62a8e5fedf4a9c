import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clientFor, createKey } from "../edge/helpers.ts";
import { launchChromium, screenshot } from "../harness/browser.ts";
import { engineKeyOf, processArgv, processRunning } from "../harness/fleet.ts";
import { type LinkedStack, startLinkedStack } from "../harness/linked-stack.ts";
import { waitUntil } from "../harness/process.ts";

/**
 * A changed profile rolls out (docs/placement.md, "Rollouts"): on the real
 * stack — workerd's edge, the control plane, an agent with three simulated
 * GPUs running sim engines — a SIGHUP with new engine_args replaces both
 * replicas one at a time, make before break, while the openai client
 * streams through the edge without a failure. A change the engine cannot
 * start with costs no serving replica, and taking it back costs nothing.
 * Rotating the engine key secret rolls the same way.
 */
const ADMIN_TOKEN = "rollout-test-admin-token";
const MODEL = "rolled";
const ARGS = '["--sim-speed", "50"]';
const NODE = "roll-1";

describe("rollout of a changed profile (real processes)", () => {
  let stack: LinkedStack | undefined;

  beforeAll(async () => {
    stack = await startLinkedStack({
      tag: "rollout",
      adminToken: ADMIN_TOKEN,
      models: `  - name: ${MODEL}
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/rolled
        engine_args: ${ARGS}
        replicas: { min: 2 }
        stop_grace: 10s
`,
      node: NODE,
      agent: { gpus: "3xH100-80GB" },
      routed: MODEL,
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
  });

  /** The profile's engine_args become `args` (as YAML), and the control plane re-reads its config. */
  const reconfigure = (args: string) => {
    const { cp } = stack!;
    const text = readFileSync(cp.configPath, "utf8").replace(/engine_args: .*$/m, `engine_args: ${args}`);
    writeFileSync(cp.configPath, text);
    cp.proc.child.kill("SIGHUP");
  };
  const replicas = () => stack!.cp.replicas();
  const ready = async () => (await replicas()).filter((r) => r.state === "ready");

  /** Closed-loop streams through the edge until `stop()`; what failed is kept with its error. */
  async function load(streams: number) {
    const openai = clientFor(stack!.edge, (await createKey(stack!.edge)).secret);
    const seen = { ok: 0, failed: [] as string[] };
    let going = true;
    const loops = Array.from({ length: streams }, async (_, i) => {
      for (let turn = 0; going; turn++) {
        try {
          const stream = await openai.chat.completions.create({
            model: MODEL,
            messages: [{ role: "user", content: `Stream ${i}, turn ${turn}.` }],
            max_tokens: 24,
            stream: true,
          });
          let finish: string | null = null;
          for await (const c of stream) finish = c.choices[0]?.finish_reason ?? finish;
          if (finish) seen.ok++;
          else seen.failed.push(`stream ${i} turn ${turn}: no finish_reason`);
        } catch (err) {
          seen.failed.push(`stream ${i} turn ${turn}: ${String(err)}`);
        }
      }
    });
    return {
      seen,
      stop: async () => {
        going = false;
        await Promise.all(loops);
      },
    };
  }

  it("replaces every replica one at a time while the openai client is served without a failure", async () => {
    const before = await waitUntil("two replicas ready", async () => {
      const rs = await ready();
      return rs.length === 2 ? rs : undefined;
    });
    const oldIds = new Set(before.map((r) => r.id));
    const traffic = await load(4);
    // What ctl shows along the way, polled: never more than one replica over
    // the two wanted, never fewer than two serving, and the older ones marked.
    let most = 0;
    let fewestReady = Number.POSITIVE_INFINITY;
    let outdatedSeen = "";
    try {
      await waitUntil("traffic served at the edge", () => traffic.seen.ok >= 8, 30_000, 100);
      reconfigure('["--sim-speed", "50", "--max-num-seqs", "32"]');
      await waitUntil(
        "both replicas replaced and ready, nothing outdated left",
        async () => {
          const rs = await replicas();
          // A replica given back reads `stopping` until its engine has stopped.
          most = Math.max(most, rs.filter((r) => r.state !== "stopping").length);
          fewestReady = Math.min(fewestReady, rs.filter((r) => r.state === "ready").length);
          outdatedSeen ||= rs.find((r) => r.outdated)?.outdated ?? "";
          return rs.length === 2 && rs.every((r) => r.state === "ready" && !r.outdated && !oldIds.has(r.id));
        },
        60_000,
        100,
      );
      // The edge routes to the new ones only, well inside the minute after
      // the control plane's start in which it keeps what it last published.
      const now = (await replicas()).map((r) => r.id).sort();
      await waitUntil(
        "the edge's pool holds the new replicas only",
        async () => {
          const pool = (await stack!.edge.sync.getPoolStatus({ model: MODEL })).pools[0];
          return JSON.stringify(pool?.endpoints.map((e) => e.id).sort()) === JSON.stringify(now);
        },
        10_000,
        100,
      );
      await waitUntil("more traffic served after the rollout", () => traffic.seen.ok >= 40, 30_000, 100);
    } finally {
      await traffic.stop();
    }
    expect(traffic.seen.failed).toEqual([]);
    expect(most).toBeLessThanOrEqual(3);
    expect(fewestReady).toBeGreaterThanOrEqual(2);
    expect(outdatedSeen).toBe(
      'engine_args are ["--sim-speed","50"], profile wants ["--sim-speed","50","--max-num-seqs","32"]',
    );
    // The engines run the new arguments.
    for (const r of await replicas()) {
      expect(processArgv(r.shards[0]!.pid!)).toEqual(expect.arrayContaining(["--max-num-seqs", "32"]));
    }
    expect(await stack!.cp.metric(`llmgw_replicas_outdated{model="${MODEL}"}`)).toBe(0);
    const log = stack!.cp.proc.output();
    expect(log).toMatch(/place rolled\/1gpu\/\d: rollout: replacing rolled\/1gpu\/\d \(engine_args are/);
    expect(log).toMatch(
      /stop rolled\/1gpu\/\d: rollout: engine_args are .*; enough replicas serve without it/,
    );
  });

  it("keeps serving on the older spec while the new one cannot start, and a change taken back restarts nothing", async () => {
    const serving = await ready();
    expect(serving).toHaveLength(2);
    const pids = serving.map((r) => r.shards[0]!.pid).sort();
    const traffic = await load(2);
    try {
      // The sim engine refuses a negative speed and exits at start, as vLLM exits on a bad flag.
      reconfigure('["--sim-speed=-1"]');
      const failing = await waitUntil(
        "the replacement failed and waits in the model's backoff",
        async () => (await replicas()).find((r) => r.lastFailure && !serving.some((s) => s.id === r.id)),
        60_000,
        250,
      );
      expect(failing.state).toMatch(/^(backoff|pending|failed|starting)$/);
      const explain = (await stack!.cp.ctl("explain", MODEL)).stdout;
      expect(explain).toContain("runs an older spec (engine_args are");
      expect(explain.split("\n")[0]).toBe(
        'rollout of rolled/1gpu: 2 replica(s) to replace (engine_args are ["--sim-speed","50","--max-num-seqs","32"], profile wants ["--sim-speed=-1"]); max_surge 1, max_unavailable 0',
      );
      // Both still serve, marked outdated, and the edge still has them.
      const now = await replicas();
      for (const s of serving) {
        expect(now.find((r) => r.id === s.id)).toMatchObject({
          state: "ready",
          outdated: expect.any(String),
        });
      }
      expect(await stack!.cp.metric(`llmgw_replicas_outdated{model="${MODEL}"}`)).toBe(2);
      const table = (await stack!.cp.ctl("replicas")).stdout;
      expect(table).toContain("ready, outdated");
      // And the dashboard, on each older replica's row.
      const browser = await launchChromium();
      try {
        const page = await browser.newPage();
        await page.goto(`${stack!.cp.adminUrl}/#token=${ADMIN_TOKEN}`);
        for (const s of serving) {
          const row = page.locator(`#replicas tr[data-replica="${s.id}"]`);
          await row.and(page.locator('[data-outdated="true"]')).waitFor({ timeout: 15_000 });
          expect(await row.locator(".outdated").textContent()).toBe(
            'runs an older spec: engine_args are ["--sim-speed","50","--max-num-seqs","32"], profile wants ["--sim-speed=-1"]',
          );
        }
        await screenshot(page, "rollout", "outdated");
      } finally {
        await browser.close();
      }

      reconfigure('["--sim-speed", "50", "--max-num-seqs", "32"]');
      await waitUntil(
        "the failing replacement forgotten, the two replicas current again",
        async () => {
          const rs = await replicas();
          return rs.length === 2 && rs.every((r) => r.state === "ready" && !r.outdated);
        },
        30_000,
        250,
      );
    } finally {
      await traffic.stop();
    }
    expect(traffic.seen.failed).toEqual([]);
    expect(traffic.seen.ok).toBeGreaterThan(0);
    expect((await replicas()).map((r) => r.shards[0]!.pid).sort()).toEqual(pids);
  });

  it("rotating the engine key secret replaces every engine, make before break, under keys of the new secret", async () => {
    const stateDir = join(stack!.cp.dir, "agents", NODE);
    const before = await ready();
    expect(before).toHaveLength(2);
    const oldKeys = new Map(before.map((r) => [r.id, engineKeyOf(stateDir, r.id)]));
    const traffic = await load(2);
    let fewestReady = Number.POSITIVE_INFINITY;
    try {
      const rotated = await stack!.cp.ctl("engine-keys", "rotate");
      expect(rotated.code).toBe(0);
      expect(rotated.stdout).toContain(
        `engine key secret rotated: new placements get keys from the new one; 2 replica(s) run with a key from the old one and are replaced one at a time (ctl replicas shows them outdated): ${[...oldKeys.keys()].sort().join(", ")}`,
      );
      await waitUntil(
        "both engines replaced",
        async () => {
          const rs = await replicas();
          fewestReady = Math.min(fewestReady, rs.filter((r) => r.state === "ready").length);
          return rs.length === 2 && rs.every((r) => r.state === "ready" && !r.outdated && !oldKeys.has(r.id));
        },
        60_000,
        100,
      );
    } finally {
      await traffic.stop();
    }
    expect(traffic.seen.failed).toEqual([]);
    expect(fewestReady).toBeGreaterThanOrEqual(2);
    for (const r of before) expect(processRunning(r.shards[0]!.pid!)).toBe(false);
    // The new engines require keys of the new secret: an old key opens neither.
    const pool = (await stack!.edge.sync.getPoolStatus({ model: MODEL })).pools[0]!;
    for (const e of pool.endpoints) {
      const url = `${e.url.replace(/\/v1$/, "")}/v1/models`;
      const key = engineKeyOf(stateDir, e.id);
      expect(key).not.toBe("");
      expect([...oldKeys.values()]).not.toContain(key);
      expect((await fetch(url, { headers: { authorization: `Bearer ${key}` } })).status).toBe(200);
      for (const old of oldKeys.values())
        expect((await fetch(url, { headers: { authorization: `Bearer ${old}` } })).status).toBe(401);
    }
    // Nothing is outdated any more.
    expect(await stack!.cp.metric(`llmgw_replicas_outdated{model="${MODEL}"}`)).toBe(0);
  });
});
