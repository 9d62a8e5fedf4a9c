import { describe, expect, it } from "vitest";
import { BIG, catalogOf, kinds, World } from "../../test/fixtures/plan-world.ts";
import { rolloutLine } from "./rollout.ts";
import { replicaStatus } from "./table.ts";
import type { Action } from "./types.ts";

const profile = (extra: Record<string, unknown> = {}) => ({
  name: "llama-8b",
  profiles: [{ name: "1gpu", engine: "vllm", source: "meta-llama/8b", replicas: { min: 2 }, ...extra }],
});
const CHANGED = { engine_args: ["--max-num-seqs", "8"] };
const WHY = 'engine_args are [], profile wants ["--max-num-seqs","8"]';

/** Two replicas placed and ready under `before`, then the profile becomes `after`. */
function rolled(nodes: ConstructorParameters<typeof World>[1], before = {}, after = CHANGED): World {
  const w = new World(catalogOf(profile(before)), nodes);
  expect(kinds(w.plan(0))).toEqual(["place llama-8b/1gpu/0", "place llama-8b/1gpu/1"]);
  w.report("ready", 1);
  expect(w.plan(2)).toEqual([]);
  w.catalog = catalogOf(profile({ ...before, ...after }));
  return w;
}

const readyCount = (w: World) => w.table.list().filter((r) => replicaStatus(r, 0) === "ready").length;

/** The engines of every shard being stopped report that they have. */
function stopped(w: World, now: number): void {
  for (const r of w.table.list())
    for (const s of r.retiring)
      w.table.observe(
        s.node,
        { replicaId: r.id, rank: s.rank, generation: r.generation, state: "stopped" },
        now,
      );
}

describe("rollout of a changed profile", () => {
  it("replaces serving replicas one at a time, each drained only once its replacement is ready", () => {
    const w = rolled({ a: {} });
    const first = w.plan(10);
    expect(kinds(first)).toEqual(["place llama-8b/1gpu/2"]);
    expect(first[0]!.reason).toBe(`rollout: replacing llama-8b/1gpu/0 (${WHY})`);
    // Starting is not serving: nothing is given up for it yet.
    expect(w.plan(11)).toEqual([]);
    w.report("ready", 12, (id) => id.endsWith("/2"));
    const drain = w.plan(13) as Extract<Action, { kind: "stop" }>[];
    expect(kinds(drain)).toEqual(["stop llama-8b/1gpu/0"]);
    expect(drain[0]).toMatchObject({ mode: "drain", retire: true });
    expect(drain[0]!.reason).toBe(`rollout: ${WHY}; enough replicas serve without it`);
    expect(readyCount(w)).toBe(2);

    // The next one's turn, while the first still drains.
    expect(kinds(w.plan(14))).toEqual(["place llama-8b/1gpu/3"]);
    stopped(w, 15);
    w.report("ready", 16, (id) => id.endsWith("/3"));
    expect(kinds(w.plan(17))).toEqual(["stop llama-8b/1gpu/1"]);
    stopped(w, 18);
    expect(w.plan(19)).toEqual([]);
    expect(w.table.list().map((r) => r.id)).toEqual(["llama-8b/1gpu/2", "llama-8b/1gpu/3"]);
  });

  it("keeps every replica serving while a full fleet has no room for a replacement", () => {
    const w = rolled({ a: { gpus: 2 } });
    const actions = w.plan(10);
    expect(kinds(actions)).toEqual(["wait llama-8b/1gpu/2"]);
    expect(actions[0]!.reason).toContain(
      `rollout: replacing llama-8b/1gpu/0 (${WHY}) waits for room for one more replica, or for rollout.max_unavailable above 0`,
    );
    expect(readyCount(w)).toBe(2);
  });

  it("with max_unavailable, drains first where there is no room, then places in the freed GPUs", () => {
    const rollout = { rollout: { max_surge: 0, max_unavailable: 1 } };
    const w = rolled({ a: { gpus: 2 } }, rollout, { ...rollout, ...CHANGED });
    expect(kinds(w.plan(10))).toEqual(["stop llama-8b/1gpu/0", "wait llama-8b/1gpu/2"]);
    // One down at most: the other keeps serving until the first replacement does.
    expect(kinds(w.plan(11))).toEqual(["wait llama-8b/1gpu/2"]);
    stopped(w, 12);
    expect(kinds(w.plan(13))).toEqual(["place llama-8b/1gpu/2"]);
    w.report("ready", 14, (id) => id.endsWith("/2"));
    expect(kinds(w.plan(15))).toEqual(["stop llama-8b/1gpu/1", "wait llama-8b/1gpu/0"]);
    stopped(w, 16);
    expect(kinds(w.plan(17))).toEqual(["place llama-8b/1gpu/0"]);
    w.report("ready", 18);
    expect(w.plan(19)).toEqual([]);
  });

  it("a replacement that fails costs no serving replica: it waits in the model's backoff", () => {
    const w = rolled({ a: {} });
    expect(kinds(w.plan(10))).toEqual(["place llama-8b/1gpu/2"]);
    w.report("failed_startup", 11, (id) => id.endsWith("/2"));
    const actions = w.plan(12);
    expect(kinds(actions)).toEqual(["restart llama-8b/1gpu/2", "wait llama-8b/1gpu/2"]);
    expect(actions[1]!.reason).toMatch(/^backoff after 1 failure/);
    expect(readyCount(w)).toBe(2);
    expect(kinds(w.plan(13))).toEqual(["wait llama-8b/1gpu/2"]);
  });

  it("stops an outdated replica that does not serve yet at once, and places it as the profile is", () => {
    // The second place is the serving replica's replacement, made before it breaks.
    const w = new World(catalogOf(profile()), { a: {} });
    w.plan(0);
    w.report("ready", 1, (id) => id.endsWith("/0"));
    w.catalog = catalogOf(profile(CHANGED));
    const actions = w.plan(10) as Extract<Action, { kind: "stop" | "place" }>[];
    expect(kinds(actions)).toEqual([
      "stop llama-8b/1gpu/1",
      "place llama-8b/1gpu/2",
      "place llama-8b/1gpu/3",
    ]);
    expect(actions[0]).toMatchObject({ mode: "stop", reason: `rollout: not serving yet and ${WHY}` });
    const placed = actions[1] as Extract<Action, { kind: "place" }>;
    expect(placed.spec.args).toEqual(CHANGED.engine_args);
  });

  it("replaces nothing for lifecycle settings, which steer no engine", () => {
    const w = rolled({ a: {} }, {}, { stop_grace: "5s", startup_deadline: "1m", spread: true } as never);
    expect(w.plan(10)).toEqual([]);
  });

  it("names the environment variables that changed, never their values", () => {
    const w = rolled({ a: {} }, { env: { HF_TOKEN: "hf_old", A: "1" } }, {
      env: { HF_TOKEN: "hf_new", A: "1" },
    } as never);
    const [place] = w.plan(10);
    expect(place!.reason).toBe("rollout: replacing llama-8b/1gpu/0 (env differs in HF_TOKEN)");
  });

  it("holds where it stands while paused, and goes on when the pause is lifted", () => {
    const w = rolled({ a: {} });
    expect(kinds(w.plan(10))).toEqual(["place llama-8b/1gpu/2"]);
    w.catalog = catalogOf(profile({ ...CHANGED, rollout: { paused: true } }));
    w.report("ready", 11, (id) => id.endsWith("/2"));
    // The replacement serves; nothing is drained or placed while paused.
    expect(w.plan(12)).toEqual([]);
    expect(w.plan(13)).toEqual([]);
    expect(readyCount(w)).toBe(3);
    w.catalog = catalogOf(profile(CHANGED));
    expect(kinds(w.plan(14))).toEqual(["stop llama-8b/1gpu/0"]);
  });

  it("paused from the change on, places no replacement and stops nothing", () => {
    const w = new World(catalogOf(profile()), { a: {} });
    w.plan(0);
    w.report("ready", 1, (id) => id.endsWith("/0"));
    w.catalog = catalogOf(profile({ ...CHANGED, rollout: { paused: true } }));
    // Neither the serving one nor the one still starting.
    expect(w.plan(10)).toEqual([]);
  });

  it("replaces the replicas whose engine key is retired, the same way, and only their generation", () => {
    const w = new World(catalogOf(profile()), { a: {} });
    w.plan(0);
    w.report("ready", 1);
    w.retiredKeys.set("llama-8b/1gpu/0", 1);
    w.retiredKeys.set("llama-8b/1gpu/1", 7);
    const [place] = w.plan(10);
    expect(kinds([place!])).toEqual(["place llama-8b/1gpu/2"]);
    expect(place!.reason).toBe(
      "rollout: replacing llama-8b/1gpu/0 (its engine key derives from a rotated secret (llmgw ctl engine-keys rotate))",
    );
    w.report("ready", 11, (id) => id.endsWith("/2"));
    expect(kinds(w.plan(12))).toEqual(["stop llama-8b/1gpu/0"]);
    // llama-8b/1gpu/1 runs generation 1, not the 7 named: it stays.
    expect(w.plan(13)).toEqual([]);
  });

  it("rolls a multi-node replica as one gang: every rank of the replacement first, then every rank drained", () => {
    const big = (extra: Record<string, unknown> = {}) => ({
      ...BIG,
      profiles: [{ ...BIG.profiles[0], ...extra }],
    });
    const ib = { fabric: { ib: "pod-a" } };
    const w = new World(catalogOf(big()), { a: ib, b: ib, c: ib, d: ib });
    expect(kinds(w.plan(0))).toEqual(["place llama-70b/tp8pp2/0"]);
    w.report("ready", 1);
    w.catalog = catalogOf(big(CHANGED));
    const [place] = w.plan(10) as Extract<Action, { kind: "place" }>[];
    expect(kinds([place!])).toEqual(["place llama-70b/tp8pp2/1"]);
    const old = w.table.get("llama-70b/tp8pp2/0")!.shards.map((s) => s.node);
    expect(place!.assignment.shards.map((s) => s.node).filter((n) => old.includes(n))).toEqual([]);
    // One rank ready is not the replica ready.
    w.table.observe(
      place!.assignment.shards[0]!.node,
      { replicaId: "llama-70b/tp8pp2/1", rank: 0, generation: 1, state: "ready" },
      11,
    );
    expect(w.plan(12)).toEqual([]);
    w.report("ready", 13, (id) => id.endsWith("/1"));
    const [drain] = w.plan(14) as Extract<Action, { kind: "stop" }>[];
    expect(drain).toMatchObject({ kind: "stop", replicaId: "llama-70b/tp8pp2/0", mode: "drain" });
    expect(drain!.shards.map((s) => s.rank).sort()).toEqual([0, 1]);
  });

  it("leaves a replica whose spec is not known yet alone", () => {
    const w = rolled({ a: {} });
    for (const r of w.table.list()) delete r.spec;
    expect(w.plan(10)).toEqual([]);
  });

  it("gives back the outdated replicas when the wanted count falls during a rollout", () => {
    const w = new World(catalogOf(profile({ replicas: { min: 2, max: 3 } })), { a: {} });
    w.plan(0);
    w.report("ready", 1);
    w.catalog = catalogOf(profile({ replicas: { min: 1, max: 1 }, ...CHANGED }));
    // One more than wanted serves: the rollout's first replica to go is drained at once,
    // and the last is replaced before it goes.
    const actions = w.plan(10) as Extract<Action, { kind: "stop" | "place" }>[];
    expect(kinds(actions)).toEqual(["stop llama-8b/1gpu/0"]);
    expect(actions[0]).toMatchObject({ mode: "drain" });
    expect(kinds(w.plan(11))).toEqual(["place llama-8b/1gpu/2"]);
    w.report("ready", 12, (id) => id.endsWith("/2"));
    expect(kinds(w.plan(13))).toEqual(["stop llama-8b/1gpu/1"]);
  });
});

describe("the rollout's line in ctl explain", () => {
  const prof = (rollout: Record<string, unknown> = {}) =>
    catalogOf(profile({ rollout })).profile("llama-8b/1gpu")!;
  it("says how many are left, what differs and how it proceeds; nothing when none is", () => {
    expect(rolloutLine(prof(), [WHY, WHY])).toBe(
      `rollout of llama-8b/1gpu: 2 replica(s) to replace (${WHY}); max_surge 1, max_unavailable 0`,
    );
    expect(rolloutLine(prof({ paused: true }), [WHY])).toBe(
      `rollout of llama-8b/1gpu: 1 replica(s) to replace (${WHY}); paused (rollout.paused)`,
    );
    expect(rolloutLine(prof(), [])).toBeUndefined();
  });
});
