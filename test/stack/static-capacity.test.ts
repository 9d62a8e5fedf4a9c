import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  clientFor,
  createKey,
  type Edge,
  type Sim,
  startEdge,
  startSim,
  stopStarted,
} from "../edge/helpers.ts";
import { type ControlPlaneHandle, startControlPlane } from "../harness/fleet.ts";
import { freePort, type Proc, REPO, runLlmgw, startProcess, waitUntil } from "../harness/process.ts";

/**
 * Router-only endpoints whose entries state no KV tokens, on the real
 * stack: an edge in workerd, a control plane publishing its config's
 * `endpoints:` to it, a sim engine behind two of them, the sim engine's
 * SGLang persona behind a third and, behind a fourth, a server that drops
 * every connection. The control plane learns the sim engine's KV tokens
 * from its /metrics, SGLang's from its metrics and its batch from its
 * server info; the dark one stays unknown. SGLang requires a key, which the
 * config names by its variable (`api_key_env`): the control plane asks the
 * server info with it and pushes it, and the edge serves with it.
 */
const SG_KV_TOKENS = 12_000;
const SG_BATCH = 24;
const BLOCKS = 1000;
const BLOCK_SIZE = 16;
const SG_KEY = "sk-static-sglang-0123456789";

describe("static endpoints' capacity, learned from the engine", () => {
  let edge: Edge;
  let sim: Sim;
  let cp: ControlPlaneHandle | undefined;
  let dark: Server;
  let darkAsked = 0;
  let sglang: Proc;

  beforeAll(async () => {
    dark = createServer((req) => {
      darkAsked++;
      req.socket.destroy();
    });
    await new Promise<void>((r) => dark.listen(0, "127.0.0.1", r));
    const darkUrl = `http://127.0.0.1:${(dark.address() as AddressInfo).port}`;
    // SGLang run by hand: its batch given per data-parallel rank, two ranks.
    const sgPort = await freePort();
    sglang = startProcess("sglang", `${REPO}/test/bin/sglang`, [
      ...["-m", "sglang.launch_server", "--model-path", "sg", "--port", String(sgPort), "--enable-metrics"],
      ...["--api-key", SG_KEY],
      ...[
        "--dp-size",
        "2",
        "--max-running-requests",
        String(SG_BATCH / 2),
        "--max-total-tokens",
        String(SG_KV_TOKENS / 2),
      ],
    ]);
    const sgUrl = `http://127.0.0.1:${sgPort}`;
    await waitUntil(
      "the SGLang engine serving",
      async () => (await fetch(`${sgUrl}/health`).catch(() => undefined))?.ok,
    );
    [edge, sim] = await Promise.all([
      startEdge({}, "static-capacity"),
      startSim("sc", ["--sim-kv-blocks", String(BLOCKS), "--block-size", String(BLOCK_SIZE)]),
    ]);
    cp = await startControlPlane(
      [
        "edge:",
        `  url: ${edge.url}`,
        "  token_env: LLMGW_TEST_EDGE_TOKEN",
        "  status_interval: 1s",
        "control: { startup_grace: 1s }",
        "models: [{ name: sc }, { name: sc-dark }, { name: sg }]",
        "endpoints:",
        `  - { id: learned, url: "${sim.url}", models: [sc], capacity: { max_num_seqs: 8 } }`,
        `  - { id: stated, url: "${sim.url}/v1", models: [sc], capacity: { kv_tokens: 4096 } }`,
        `  - { id: dark, url: "${darkUrl}", models: [sc-dark] }`,
        `  - { id: sglang, url: "${sgUrl}/v1", models: [sg], api_key_env: LLMGW_TEST_SGLANG_KEY }`,
      ].join("\n"),
      {
        env: { LLMGW_TEST_EDGE_TOKEN: edge.token, LLMGW_TEST_SGLANG_KEY: SG_KEY },
        adminToken: "static-capacity-admin-token",
      },
    );
  }, 120_000);

  afterAll(async () => {
    await cp?.proc.kill();
    await sglang?.kill();
    dark?.closeAllConnections();
    dark?.close();
    await stopStarted();
  });

  const endpoints = async (model: string) => (await edge.sync.getPoolStatus({ model })).pools[0]?.endpoints;
  const status = (model: string) =>
    runLlmgw(["ctl", "endpoints", "status", model, "--edge", edge.url], { LLMGW_EDGE_TOKEN: edge.token });

  it("the pool counts the KV tokens the engine's /metrics states, a stated figure wins, the stated batch stays", async () => {
    const learned = await waitUntil("the learned endpoint's KV tokens in the pool", async () => {
      const e = (await endpoints("sc"))?.find((x) => x.id === "learned");
      return e && e.kvTokens > 0n ? e : undefined;
    });
    expect(learned.kvTokens).toBe(BigInt(BLOCKS * BLOCK_SIZE));
    expect(learned.maxNumSeqs).toBe(8);
    const stated = (await endpoints("sc"))?.find((x) => x.id === "stated");
    expect(stated?.kvTokens).toBe(4096n);
    expect(stated?.maxNumSeqs).toBe(0);

    const shown = await status("sc");
    expect(shown.code).toBe(0);
    expect(shown.stdout).toMatch(/learned\s.*8 seqs, 16,000 tokens/);
    expect(shown.stdout).toMatch(/stated\s.*seqs assumed, 4,096 tokens/);

    const key = await createKey(edge, { band: "gold" });
    const reply = await clientFor(edge, key.secret).chat.completions.create({
      model: "sc",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    });
    expect(reply.choices[0]?.message.content).toBeTruthy();
  }, 60_000);

  it("an endpoint whose /metrics cannot be read stays unknown, is retried, and is logged once", async () => {
    // The first probe and a retry (5 s after it) both failed.
    await waitUntil("the dark endpoint asked twice", () => darkAsked >= 2, 30_000);
    const e = await waitUntil("the dark endpoint in its pool", async () =>
      (await endpoints("sc-dark"))?.find((x) => x.id === "dark"),
    );
    expect(e.kvTokens).toBe(0n);
    expect(e.maxNumSeqs).toBe(0);
    expect((await status("sc-dark")).stdout).toMatch(/dark\s.*seqs assumed(?!, )/);

    const logged = cp!.proc
      .output()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { level: string; msg: string; endpoint?: string; component?: string })
      .filter((l) => l.component === "static-capacity" && l.endpoint === "dark");
    expect(logged).toHaveLength(1);
    expect(logged[0]?.level).toBe("warn");
    expect(logged[0]?.msg).toContain("capacity unreadable");
    // The dark endpoint held nothing else back: the learned figure still stands.
    expect((await endpoints("sc"))?.find((x) => x.id === "learned")?.kvTokens).toBe(
      BigInt(BLOCKS * BLOCK_SIZE),
    );
  }, 60_000);

  it("an SGLang endpoint's batch comes from its server info and its KV tokens from its metrics", async () => {
    const e = await waitUntil("the SGLang endpoint's capacity in the pool", async () => {
      const x = (await endpoints("sg"))?.find((y) => y.id === "sglang");
      return x && x.kvTokens > 0n && x.maxNumSeqs > 0 ? x : undefined;
    });
    expect(e.kvTokens).toBe(BigInt(SG_KV_TOKENS));
    expect(e.maxNumSeqs).toBe(SG_BATCH);
    expect((await status("sg")).stdout).toMatch(/sglang\s.*24 seqs, 12,000 tokens/);
    // Its server info and its API want the key, which the control plane pushed and the edge sends.
    expect((await fetch(`${e.url.replace(/\/v1$/, "")}/server_info`)).status).toBe(401);
    const key = await createKey(edge, { band: "gold" });
    const reply = await clientFor(edge, key.secret).chat.completions.create({
      model: "sg",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    });
    expect(reply.choices[0]?.message.content).toBeTruthy();
    expect(cp!.proc.output()).not.toContain(SG_KEY);
  }, 60_000);
});
