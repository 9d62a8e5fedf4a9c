import { describe, expect, it } from "vitest";
import { gpuNode } from "../../test/fixtures/placement.ts";
import { buildCatalog } from "../catalog.ts";
import { configSchema } from "../config/schema.ts";
import { KnownFleetStore } from "../known-fleet-store.ts";
import type { PlacementNode } from "../placement/types.ts";
import { type RegistrationInfo, Registry } from "../registry.ts";
import { knownFleet } from "./known-fleet.ts";
import { plan, planSettings } from "./plan.ts";
import { ReplicaTable } from "./table.ts";

const config = configSchema.parse({
  control: { lost_after: "60s", startup_grace: "5s" },
  models: [
    { name: "m", profiles: [{ name: "1gpu", engine: "vllm", source: "org/m", replicas: { min: 2 } }] },
  ],
});
const catalog = buildCatalog(config);
const timers = {
  unreachableAfterMs: 15_000,
  lostAfterMs: 60_000,
  startupGraceMs: 5_000,
  lostFreezeFraction: 0.5,
};

function info(name: string): RegistrationInfo {
  return {
    name,
    agentVersion: "test",
    agentInstance: `${name}-1`,
    advertiseAddress: `10.0.0.${name === "a" ? 1 : 2}`,
    fabric: {},
    inventory: { gpus: [], cpuCores: 8, ramTotalMiB: 1024, hostname: name, simulated: true },
  };
}

/** A control plane's table and registry, as the server wires them. */
function world(startedAt: number) {
  const registry = new Registry(timers, startedAt);
  const table = new ReplicaTable();
  const nodes = (): PlacementNode[] =>
    registry.list().map((n) => gpuNode(n.name, { gpus: 1, state: n.state }));
  const pass = (now: number) => {
    const actions = plan(table.planState(catalog, nodes(), planSettings(config.control, startedAt)), now);
    table.apply(actions, now);
    return actions;
  };
  return { registry, table, pass };
}

describe("the fleet known across a control plane restart", () => {
  // Before the restart: two nodes, one replica ready on each.
  const T = 1_000_000;
  const before = world(T);
  before.registry.register(info("a"), T);
  before.registry.register(info("b"), T);
  before.pass(T + 6_000);
  for (const r of before.table.list())
    for (const s of r.shards)
      before.table.observe(
        s.node,
        { replicaId: r.id, rank: s.rank, generation: r.generation, state: "ready" },
        T + 7_000,
      );
  const kept = knownFleet(before.table.list(), before.registry.list());

  it("keeps the nodes that hold live shards, and those shards", () => {
    expect(kept.nodes.map((n) => n.name)).toEqual(["a", "b"]);
    expect(
      kept.replicas.map((r) => [r.id, r.generation, r.shards.map((s) => `${s.node}:${s.state}`)]),
    ).toEqual([
      ["m/1gpu/0", 1, ["a:ready"]],
      ["m/1gpu/1", 1, ["b:ready"]],
    ]);
  });

  it("survives the database, and a row it cannot read is named and ignored", () => {
    const store = new KnownFleetStore(":memory:");
    expect(store.load()).toEqual({ fleet: { nodes: [], replicas: [] } });
    expect(store.save(kept, T)).toBe(true);
    expect(store.save(kept, T + 1)).toBe(false);
    expect(store.load().fleet).toEqual(kept);
    const broken = { ...kept, replicas: [{ ...kept.replicas[0]!, generation: -1 }] };
    store.save(broken as typeof kept, T + 2);
    expect(store.load().error).toBe(
      "known_fleet.replicas.0.generation: Too small: expected number to be >=0",
    );
  });

  it("awaits a late node past the startup grace, adopts its replica when it registers, and places nothing twice", () => {
    const S = T + 600_000;
    const after = world(S);
    for (const n of kept.nodes) after.registry.expect(n, S);
    after.table.restore(kept.replicas, S);
    expect(after.registry.get("b")).toMatchObject({ state: "unreachable", awaiting: true, connected: false });

    // a is back at once; b only 40 s after the start — far past the 5 s grace.
    after.registry.register(info("a"), S + 1_000);
    after.table.observeRegistration(
      "a",
      [
        {
          replicaId: "m/1gpu/0",
          rank: 0,
          generation: 1,
          state: "ready",
          gpus: [0],
          ports: { http: 20000, distInit: [] },
        },
      ],
      S + 1_000,
    );
    for (let t = S + 2_000; t < S + 40_000; t += 1_000) {
      after.registry.tick(t);
      expect(after.pass(t).filter((a) => a.kind !== "adopt")).toEqual([]);
    }
    expect(after.registry.register(info("b"), S + 40_000)?.reason).toBe(
      "agent registered after the control plane restart",
    );
    after.table.observeRegistration(
      "b",
      [
        {
          replicaId: "m/1gpu/1",
          rank: 0,
          generation: 1,
          state: "ready",
          gpus: [0],
          ports: { http: 20000, distInit: [] },
        },
      ],
      S + 40_000,
    );
    expect(after.pass(S + 41_000)).toEqual([]);
    expect(
      after.table.list().map((r) => [r.id, r.generation, r.shards.map((s) => `${s.node}:${s.state}`)]),
    ).toEqual([
      ["m/1gpu/0", 1, ["a:ready"]],
      ["m/1gpu/1", 1, ["b:ready"]],
    ]);
  });

  it("gives up on a node that is not back within lost_after of the start, and places its replica again", () => {
    const S = T + 600_000;
    const after = world(S);
    for (const n of kept.nodes) after.registry.expect(n, S);
    after.table.restore(kept.replicas, S);
    // a is back, and a new node c has room for b's replica.
    for (const n of ["a", "c"]) {
      after.registry.register(info(n), S + 1_000);
      after.registry.seen(n, S + 50_000);
    }
    expect(after.registry.tick(S + 59_000)).toEqual([]);
    expect(after.registry.tick(S + 60_000)).toEqual([
      {
        node: "b",
        from: "unreachable",
        to: "lost",
        at: S + 60_000,
        reason: "not back 60s after the control plane started",
      },
    ]);
    const actions = after.pass(S + 60_000);
    expect(actions.map((a) => `${a.kind} ${a.replicaId}`)).toEqual(["restart m/1gpu/1", "place m/1gpu/1"]);
    expect(after.table.get("m/1gpu/1")).toMatchObject({ generation: 2, shards: [{ node: "c" }] });
  });

  it("takes a node's word that a kept replica is gone: its slot is placed again, no failure, no backoff", () => {
    const S = T + 600_000;
    const after = world(S);
    for (const n of kept.nodes) after.registry.expect(n, S);
    after.table.restore(kept.replicas, S);
    // b's engine was stopped on purpose while no control plane ran (npm start's Ctrl-C).
    after.registry.register(info("b"), S + 1_000);
    after.table.observeRegistration("b", [], S + 1_000);
    const r = after.table.get("m/1gpu/1")!;
    expect(r.shards).toEqual([]);
    const actions = after.pass(S + 6_000);
    expect(actions.map((a) => `${a.kind} ${a.replicaId}`)).toContain("place m/1gpu/1");
    expect(after.table.get("m/1gpu/1")).toMatchObject({ restarts: 0, generation: 2 });
    expect(after.table.get("m/1gpu/1")?.lastFailure).toBeUndefined();
    expect(after.table.backoff.size).toBe(0);
  });
});
