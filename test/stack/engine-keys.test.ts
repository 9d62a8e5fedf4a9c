import { appendFileSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readStateFile, STATE_FILE_NAME } from "../../agent/state-file.ts";
import { openEngineKeys } from "../../controlplane/engine-keys.ts";
import { OneRowStore } from "../../controlplane/one-row-store.ts";
import { clientFor, createKey, type Edge } from "../edge/helpers.ts";
import { type LinkedStack, startLinkedStack } from "../harness/linked-stack.ts";
import { waitUntil } from "../harness/process.ts";

/**
 * Engine keys on the real stack (docs/security.md, "Engine keys"): the
 * control plane launches each replica's engine (the sim engine through the
 * vLLM adapter) requiring a key of its own, and publishes that key to the
 * edge with the replica's endpoint. The openai client is served through the
 * edge; the engine's API refuses a caller without the key, as vLLM does;
 * nothing an operator reads (ctl, the processes' logs, the engine's log)
 * shows the key; and a restarted control plane publishes the same key for
 * the engine it finds running, which it leaves alone.
 */
const ADMIN_TOKEN = "engine-keys-test-admin-token";
const MODEL = "keyed";
const NODE = "key-1";

describe("engine keys", () => {
  let edge: Edge;
  let stack: LinkedStack | undefined;

  beforeAll(async () => {
    stack = await startLinkedStack({
      tag: "engine-keys",
      adminToken: ADMIN_TOKEN,
      models: `  - name: ${MODEL}
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/keyed
        engine_args: ["--sim-speed", "50"]
        replicas: { min: 1 }
`,
      node: NODE,
      agent: { gpus: "1xH100-80GB" },
      routed: MODEL,
    });
    ({ edge } = stack);
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
  });

  const stateDir = () => join(stack!.cp.dir, "agents", NODE);
  /** The replica, where its engine listens, as which process, and the key it was launched with (the agent's record). */
  const replica = async () => {
    const [r] = await stack!.cp.replicas();
    const shard = r!.shards[0]!;
    // Where the edge reaches it: the agent's own loopback address.
    const e = (await edge.sync.getPoolStatus({ model: MODEL })).pools[0]!.endpoints[0]!;
    const { records } = readStateFile(join(stateDir(), STATE_FILE_NAME));
    const spec = records.find((rec) => rec.replicaId === r!.id)!.spec;
    return {
      id: r!.id,
      url: e.url.replace(/\/v1$/, ""),
      pid: shard.pid,
      key: spec.engineApiKey,
      generation: Number(spec.generation),
    };
  };
  const models = (url: string, key?: string) =>
    fetch(`${url}/v1/models`, key ? { headers: { authorization: `Bearer ${key}` } } : {});

  it("serves the openai client through the edge, which sends the engine its key", async () => {
    const openai = clientFor(edge, (await createKey(edge)).secret);
    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Say hello." }],
      max_tokens: 8,
      stream: true,
    });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
    expect(text.length).toBeGreaterThan(0);
  }, 60_000);

  it("leaves the engine's API closed to anyone without the key, its health and metrics open", async () => {
    const r = await replica();
    expect(r.key).toMatch(/^llmgw-e-/);
    const none = await models(r.url);
    expect(none.status).toBe(401);
    expect(await none.json()).toEqual({ error: "Unauthorized" });
    // The key of the same replica's next placement, from the same secret, is not this engine's.
    const keys = openEngineKeys(join(stack!.cp.dir, "data", "llmgw.db"), Date.now());
    const next = keys.forReplica(r.id, r.generation + 1);
    expect(keys.forReplica(r.id, r.generation)).toBe(r.key);
    keys.close();
    expect((await models(r.url, next)).status).toBe(401);
    expect((await models(r.url, r.key)).status).toBe(200);
    expect((await fetch(`${r.url}/health`)).status).toBe(200);
    expect((await fetch(`${r.url}/metrics`)).status).toBe(200);
  });

  it("shows the key nowhere an operator reads, and keeps it owner-only in the agent's state", async () => {
    const { key } = await replica();
    const shown = [
      (await stack!.cp.ctl("replicas", "--json")).stdout,
      (await stack!.cp.ctl("explain", MODEL, "--json")).stdout,
      stack!.cp.proc.output(),
      stack!.agent.output(),
    ];
    const logs = join(stateDir(), "logs");
    for (const f of readdirSync(logs)) shown.push(readFileSync(join(logs, f), "utf8"));
    for (const text of shown) expect(text).not.toContain(key);
    // The agent keeps the spec it launched with, key and all, to adopt the engine after a restart.
    const held = join(stateDir(), STATE_FILE_NAME);
    expect(readFileSync(held, "utf8")).toContain(key);
    expect(statSync(held).mode & 0o077).toBe(0);
  });

  const ask = async (content: string) => {
    const openai = clientFor(edge, (await createKey(edge)).secret);
    const reply = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content }],
      max_tokens: 4,
    });
    return reply.choices[0]?.message.content;
  };
  /** kill -9 of the control plane, then a start on the same database, once its agent has reported the replica again. */
  const restartControlPlane = async (pid: number | null) => {
    await stack!.cp.proc.kill("SIGKILL");
    await stack!.cp.restart();
    await waitUntil("the replica reported again, the same process", async () => {
      const [r] = await stack!.cp.replicas().catch(() => []);
      return r?.state === "ready" && r.shards[0]?.pid === pid;
    });
  };

  it("after a control plane restart, the same key for the same engine, untouched", async () => {
    const before = await replica();
    await restartControlPlane(before.pid);
    expect(await ask("Again.")).toBeTruthy();
    const after = await replica();
    expect(after.pid).toBe(before.pid);
    expect(after.key).toBe(before.key);
    expect((await models(after.url, before.key)).status).toBe(200);
  }, 90_000);

  it("sends a running engine the key it was launched with, also from a control plane whose secret is another now", async () => {
    const before = await replica();
    // Another secret, as a replaced database would bring: this control plane would derive another key.
    const secret = new OneRowStore<Uint8Array>(join(stack!.cp.dir, "data", "llmgw.db"), {
      table: "engine_key_secret",
      column: "secret",
      type: "BLOB",
      writtenAt: "created_at_ms",
    });
    secret.write(new Uint8Array(32).fill(9), Date.now());
    secret.close();
    await restartControlPlane(before.pid);
    const keys = openEngineKeys(join(stack!.cp.dir, "data", "llmgw.db"), Date.now());
    expect(keys.forReplica(before.id, before.generation)).not.toBe(before.key);
    keys.close();
    // A static endpoint for another model, loaded with SIGHUP: the control plane publishes its set
    // again, the replica's entry as it knows it now.
    appendFileSync(
      stack!.cp.configPath,
      `  - name: keys-marker\nendpoints:\n  - { id: marker, url: "http://127.0.0.1:9", models: [keys-marker] }\n`,
    );
    stack!.cp.proc.child.kill("SIGHUP");
    await waitUntil("the set with the marker at the edge", async () => {
      const pools = (await edge.sync.getPoolStatus({ model: "keys-marker" }).catch(() => undefined))?.pools;
      return pools?.[0]?.endpoints.some((e) => e.id === "marker") ?? false;
    });
    expect(await ask("Still you?")).toBeTruthy();
    expect((await replica()).pid).toBe(before.pid);
  }, 90_000);
});
