import { describe, expect, it } from "vitest";
import type { ShardState } from "../../common/shard-state.ts";
import { gpuNode } from "../../test/fixtures/placement.ts";
import { BIG, catalogOf, kinds, SMALL, spec8b, World } from "../../test/fixtures/plan-world.ts";
import { parseReplicaId, replicaId } from "./ids.ts";
import { backoffAfter } from "./plan.ts";
import { replicaStatus } from "./table.ts";
import type { Action } from "./types.ts";

const fourNodes = () => ({
  a: { fabric: { ib: "pod-a" } },
  b: { fabric: { ib: "pod-a" } },
  c: { fabric: { ib: "pod-b" } },
  d: {},
});

describe("replica ids", () => {
  it("round-trip, with slashes in model names", () => {
    expect(replicaId("meta-llama/Llama-3", "tp8", 2)).toBe("meta-llama/Llama-3/tp8/2");
    expect(parseReplicaId("meta-llama/Llama-3/tp8/2")).toEqual({
      model: "meta-llama/Llama-3",
      profile: "tp8",
      index: 2,
    });
    expect(parseReplicaId("nope")).toBeUndefined();
  });
});

describe("placing what is missing", () => {
  it("places the biggest profile first, then is idle once everything runs", () => {
    const w = new World(catalogOf(SMALL, BIG), fourNodes());
    const first = w.plan(0);
    expect(kinds(first)).toEqual([
      "place llama-70b/tp8pp2/0",
      "place llama-8b/1gpu/0",
      "place llama-8b/1gpu/1",
      "place llama-8b/1gpu/2",
    ]);
    const gang = first[0] as Extract<Action, { kind: "place" }>;
    expect(gang.assignment.shards.map((s) => s.node)).toEqual(["a", "b"]);
    expect(gang.generation).toBe(1);
    // The 8B replicas avoid the gang's nodes and each other where they can.
    const small = first
      .slice(1)
      .map((a) => (a as Extract<Action, { kind: "place" }>).assignment.shards[0]!.node);
    expect(new Set(small).size).toBe(2);
    expect(small).not.toContain("a");
    w.report("ready", 1000);
    expect(w.plan(2000)).toEqual([]);
    expect(replicaStatus(w.table.get("llama-70b/tp8pp2/0")!, 2000)).toBe("ready");
  });

  it("says why a replica waits, once per pass per profile", () => {
    const w = new World(catalogOf(BIG), {
      a: { fabric: { ib: "x" } },
      b: { state: "lost", fabric: { ib: "x" } },
    });
    const actions = w.plan(0);
    expect(actions).toHaveLength(1);
    const wait = actions[0] as Extract<Action, { kind: "wait" }>;
    expect(wait.kind).toBe("wait");
    expect(wait.reason).toBe(
      "0/2 nodes can host llama-70b/tp8pp2: 1 lost, 1 is in ib groups with fewer than 2 eligible nodes of one GPU shape",
    );
    expect(w.table.get("llama-70b/tp8pp2/0")?.waiting?.reason).toBe(wait.reason);
  });
});

describe("gang restart and backoff", () => {
  it("stops every rank when one fails, then places again after the backoff", () => {
    const w = new World(catalogOf(BIG), fourNodes());
    w.plan(0);
    w.report("ready", 1);
    const id = "llama-70b/tp8pp2/0";
    w.table.observe(
      "b",
      {
        replicaId: id,
        rank: 1,
        generation: 1,
        state: "failed_running",
        failure: { reason: "exit 1: CUDA error", exitCode: 1 },
      },
      100_000,
    );
    const restart = w.plan(100_000);
    expect(kinds(restart)).toEqual([`restart ${id}`, `wait ${id}`]);
    const r = restart[0] as Extract<Action, { kind: "restart" }>;
    expect(r.kind).toBe("restart");
    expect(r.stop).toEqual([{ node: "a", rank: 0 }]);
    expect(r.backoff).toEqual({ failures: 1, retryAt: 110_000, lastFailure: r.failure });
    expect(r.failure.exitCode).toBe(1);
    // Still within backoff: wait, even though rank 0 is stopping.
    const waiting = w.plan(105_000);
    expect(kinds(waiting)).toEqual([`wait ${id}`]);
    expect((waiting[0] as Extract<Action, { kind: "wait" }>).until).toBe(110_000);
    w.table.observe("a", { replicaId: id, rank: 0, generation: 1, state: "stopped" }, 106_000);
    const again = w.plan(110_000);
    expect(kinds(again)).toEqual([`place ${id}`]);
    expect((again[0] as Extract<Action, { kind: "place" }>).generation).toBe(2);
    expect(w.table.get(id)?.restarts).toBe(1);
  });

  it("doubles the backoff per failure up to max_backoff, and resets once the model is ready", () => {
    const s = { baseBackoffMs: 10_000, maxBackoffMs: 60_000 };
    const f = { reason: "x", at: 0, countsForBackoff: true };
    const delays: number[] = [];
    let b = backoffAfter(undefined, f, 0, s);
    for (let i = 0; i < 5; i++) {
      delays.push(b.retryAt);
      b = backoffAfter(b, f, 0, s);
    }
    expect(delays).toEqual([10_000, 20_000, 40_000, 60_000, 60_000]);

    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
    });
    const id = "llama-8b/1gpu/0";
    let now = 0;
    const seen: number[] = [];
    for (let i = 0; i < 4; i++) {
      const placed = w.plan(now);
      expect(kinds(placed)).toEqual([`place ${id}`]);
      w.report("failed_startup", now + 1);
      const [restart] = w.plan(now + 2) as Extract<Action, { kind: "restart" }>[];
      seen.push(restart!.backoff!.retryAt - (now + 2));
      now = restart!.backoff!.retryAt;
    }
    expect(seen).toEqual([10_000, 20_000, 40_000, 60_000]);
    w.plan(now);
    w.report("ready", now + 1);
    expect(w.table.backoff.has("llama-8b")).toBe(false);
  });
});

describe("lost versus unreachable", () => {
  it("keeps shards on an unreachable node and re-places those on a lost one without backoff", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
      b: {},
    });
    w.plan(0);
    w.report("ready", 1);
    const id = "llama-8b/1gpu/0";
    const node = w.table.get(id)!.shards[0]!.node;
    w.node(node).state = "unreachable";
    expect(w.plan(20_000)).toEqual([]);
    w.node(node).state = "lost";
    const actions = w.plan(80_000);
    expect(kinds(actions)).toEqual([`restart ${id}`, `place ${id}`]);
    const restart = actions[0] as Extract<Action, { kind: "restart" }>;
    expect(restart.release).toEqual([{ node, rank: 0 }]);
    expect(restart.stop).toEqual([]);
    expect(restart.backoff).toBeUndefined();
    const place = actions[1] as Extract<Action, { kind: "place" }>;
    expect(place.assignment.shards[0]!.node).not.toBe(node);
    expect(w.table.get(id)!.retiring).toEqual([]);
  });

  it("restarts a gang when one of its nodes is lost, stopping the surviving rank", () => {
    const w = new World(catalogOf(BIG), { ...fourNodes(), e: { fabric: { ib: "pod-b" } } });
    w.plan(0);
    w.report("ready", 1);
    w.node("b").state = "lost";
    const actions = w.plan(90_000);
    expect(kinds(actions)).toEqual(["restart llama-70b/tp8pp2/0", "place llama-70b/tp8pp2/0"]);
    const r = actions[0] as Extract<Action, { kind: "restart" }>;
    expect(r.stop).toEqual([{ node: "a", rank: 0 }]);
    expect(r.release).toEqual([{ node: "b", rank: 1 }]);
    // pod-a has one node left; the gang moves to pod-b.
    const p = actions[1] as Extract<Action, { kind: "place" }>;
    expect(p.assignment.fabric).toEqual({ key: "ib", value: "pod-b" });
  });

  describe("a node back after it was lost", () => {
    const id = "llama-8b/1gpu/0";
    const spec = spec8b;
    /** One replica ready on `a`, then `a` lost, and `others` (if any) join to take a replacement. */
    function lostWorld(others: string[]): World {
      const w = new World(
        catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }),
        {
          a: {},
        },
      );
      w.plan(0);
      w.report("ready", 1);
      w.node("a").state = "lost";
      for (const n of others) w.nodes.push(gpuNode(n));
      return w;
    }
    const comeBack = (w: World, now: number, state: ShardState = "ready") => {
      w.node("a").state = "ready";
      w.table.observeRegistration(
        "a",
        [{ replicaId: id, rank: 0, generation: 1, state, spec, gpus: [0] }],
        now,
      );
    };

    it("adopts its engine when nothing was placed in its stead", () => {
      const w = lostWorld([]);
      expect(kinds(w.plan(80_000))).toEqual([`restart ${id}`, `wait ${id}`]);
      comeBack(w, 90_000);
      const back = w.plan(90_001);
      expect(kinds(back)).toEqual([`adopt ${id}`]);
      expect(w.table.get(id)).toMatchObject({ generation: 1, adopted: true, retiring: [] });
      expect(w.table.get(id)!.shards.map((s) => [s.node, s.state])).toEqual([["a", "ready"]]);
      expect(w.plan(90_002)).toEqual([]);
    });

    it("is reinstated over a replacement that is still starting, which stops", () => {
      const w = lostWorld(["b"]);
      expect(kinds(w.plan(80_000))).toEqual([`restart ${id}`, `place ${id}`]);
      w.report("starting", 80_001);
      comeBack(w, 90_000);
      const back = w.plan(90_001);
      expect(kinds(back)).toEqual([`reinstate ${id}`]);
      const r = back[0] as Extract<Action, { kind: "reinstate" }>;
      expect(r).toMatchObject({
        generation: 1,
        shards: [{ node: "a", rank: 0 }],
        stop: [{ node: "b", rank: 0 }],
      });
      expect(r.reason).toBe(
        "generation 1 on a is back and serving; the replacement (generation 2) is not ready yet",
      );
      const rec = w.table.get(id)!;
      expect(rec.generation).toBe(1);
      expect(rec.shards.map((s) => [s.node, s.state])).toEqual([["a", "ready"]]);
      expect(rec.retiring.map((s) => [s.node, s.state])).toEqual([["b", "stopping"]]);
      w.table.observe("b", { replicaId: id, rank: 0, generation: 2, state: "stopped" }, 90_002);
      expect(w.plan(90_003)).toEqual([]);
      expect(w.table.get(id)!.retiring).toEqual([]);
    });

    it("is reinstated with an older spec, for the rollout to replace once that one is ready", () => {
      const w = lostWorld(["b"]);
      // The profile changed while `a` was away; its replacement runs the new spec.
      const changed = { ...SMALL.profiles[0], replicas: { min: 1 }, engine_args: ["--max-num-seqs", "8"] };
      w.catalog = catalogOf({ ...SMALL, profiles: [changed] });
      expect(kinds(w.plan(80_000))).toEqual([`restart ${id}`, `place ${id}`]);
      w.report("starting", 80_001);
      comeBack(w, 90_000);
      expect(kinds(w.plan(90_001))).toEqual([`reinstate ${id}`]);
      expect(w.table.get(id)!.spec).toEqual(spec);
      w.table.observe("b", { replicaId: id, rank: 0, generation: 2, state: "stopped" }, 90_002);
      const next = w.plan(90_003);
      expect(kinds(next)).toEqual(["place llama-8b/1gpu/1"]);
      expect(next[0]!.reason).toMatch(/^rollout: replacing llama-8b\/1gpu\/0 \(engine_args are \[\]/);
    });

    it("stops as a stray when the replacement already serves", () => {
      const w = lostWorld(["b"]);
      w.plan(80_000);
      w.report("ready", 80_001);
      comeBack(w, 90_000);
      const back = w.plan(90_001) as Extract<Action, { kind: "stop" }>[];
      expect(kinds(back)).toEqual([`stop ${id}`]);
      expect(back[0]).toMatchObject({ shards: [{ node: "a", rank: 0 }], retire: false });
      expect(w.table.get(id)!.shards.map((s) => [s.node, s.state])).toEqual([["b", "ready"]]);
    });

    it("stops as a stray while it still starts itself: the replacement is kept", () => {
      const w = lostWorld(["b"]);
      w.plan(80_000);
      comeBack(w, 90_000, "starting");
      expect(kinds(w.plan(90_001))).toEqual([`stop ${id}`]);
      expect(w.table.get(id)!.shards.map((s) => s.node)).toEqual(["b"]);
    });
  });
});

describe("adoption", () => {
  it("adopts matching shards an agent reports and places only what is missing", () => {
    const w = new World(catalogOf(SMALL), { a: {}, b: {} });
    w.table.observeRegistration(
      "a",
      [
        {
          replicaId: "llama-8b/1gpu/1",
          rank: 0,
          generation: 4,
          state: "ready",
          gpus: [3],
          ports: { http: 20000, distInit: [] },
          spec: spec8b,
        },
      ],
      0,
    );
    const actions = w.plan(0);
    expect(kinds(actions)).toEqual([
      "adopt llama-8b/1gpu/1",
      "place llama-8b/1gpu/0",
      "place llama-8b/1gpu/2",
    ]);
    const places = actions.slice(1) as Extract<Action, { kind: "place" }>[];
    for (const p of places) {
      const s = p.assignment.shards[0]!;
      expect(s.node === "a" && (s.gpus.includes(3) || s.ports.http === 20000)).toBe(false);
    }
    expect(w.table.get("llama-8b/1gpu/1")?.generation).toBe(4);
    w.report("ready", 1);
    expect(w.plan(2)).toEqual([]);
  });

  it("adopts into a slot that was already waiting when the agent re-registers late", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: { cordoned: true },
    });
    expect(kinds(w.plan(0))).toEqual(["wait llama-8b/1gpu/0"]);
    w.table.observeRegistration(
      "a",
      [{ replicaId: "llama-8b/1gpu/0", rank: 0, generation: 3, state: "ready", gpus: [0], spec: spec8b }],
      5,
    );
    expect(kinds(w.plan(6))).toEqual(["adopt llama-8b/1gpu/0"]);
    expect(w.table.get("llama-8b/1gpu/0")?.waiting).toBeUndefined();
    expect(w.plan(7)).toEqual([]);
  });

  it("holds new placements until placeAfter, while adopting what is reported", () => {
    const w = new World(catalogOf(SMALL), { a: {}, b: {} });
    w.settings = { ...w.settings, placeAfter: 60_000 };
    w.table.observeRegistration(
      "a",
      [{ replicaId: "llama-8b/1gpu/0", rank: 0, generation: 1, state: "ready", gpus: [0], spec: spec8b }],
      0,
    );
    const early = w.plan(1_000);
    expect(kinds(early)).toEqual(["adopt llama-8b/1gpu/0", "wait llama-8b/1gpu/1", "wait llama-8b/1gpu/2"]);
    expect(kinds(w.plan(60_000))).toEqual(["place llama-8b/1gpu/1", "place llama-8b/1gpu/2"]);
  });

  it("stops a reported replica of another world size", () => {
    const w = new World(catalogOf(SMALL), { a: {} });
    w.table.observeRegistration(
      "a",
      [
        {
          replicaId: "llama-8b/1gpu/0",
          rank: 0,
          state: "ready",
          spec: { ...spec8b, nodes: 2 },
          worldNodes: 2,
        },
      ],
      0,
    );
    const [stop] = w.plan(0) as Extract<Action, { kind: "stop" }>[];
    expect(stop?.kind).toBe("stop");
    expect(stop?.retire).toBe(true);
    expect(stop?.reason).toBe("reported replica does not match llama-8b/1gpu: nodes is 2, profile wants 1");
  });

  it("adopts a reported replica with an older spec, for the rollout to replace", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
    });
    w.table.observeRegistration(
      "a",
      [{ replicaId: "llama-8b/1gpu/0", rank: 0, state: "ready", spec: { ...spec8b, source: "old/7b" } }],
      0,
    );
    const actions = w.plan(0);
    expect(kinds(actions)).toEqual(["adopt llama-8b/1gpu/0", "place llama-8b/1gpu/1"]);
    expect(actions[0]!.reason).toBe(
      "running rank 0 on a serves llama-8b/1gpu with an older spec (source is old/7b, profile wants meta-llama/8b): the rollout replaces it",
    );
  });

  it("holds a gang with ranks missing for the adoption grace, then restarts it without backoff", () => {
    const w = new World(catalogOf(BIG), fourNodes());
    const spec = {
      ...spec8b,
      source: "meta-llama/70b",
      tensorParallel: 8,
      pipelineParallel: 2,
      nodes: 2,
      gpusPerNode: 8,
    };
    w.table.observeRegistration(
      "a",
      [{ replicaId: "llama-70b/tp8pp2/0", rank: 0, generation: 2, state: "ready", spec, worldNodes: 2 }],
      0,
    );
    expect(w.plan(30_000)).toEqual([]);
    const late = w.plan(61_000);
    expect(kinds(late)).toEqual(["restart llama-70b/tp8pp2/0", "place llama-70b/tp8pp2/0"]);
    expect((late[0] as Extract<Action, { kind: "restart" }>).backoff).toBeUndefined();
  });

  it("a restarted agent that lost a shard fails it; an unsent start is not the model's fault", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
    });
    w.plan(0);
    w.table.observeRegistration("a", [], 1);
    const [restart] = w.plan(2) as Extract<Action, { kind: "restart" }>[];
    expect(restart?.failure.countsForBackoff).toBe(false);
    expect(restart?.backoff).toBeUndefined();
  });

  it("stops a stray shard of an older generation", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
    });
    w.plan(0);
    w.report("ready", 1);
    w.table.observe(
      "a",
      { replicaId: "llama-8b/1gpu/0", rank: 0, generation: 0, state: "ready", gpus: [5] },
      2,
    );
    const [stop] = w.plan(3) as Extract<Action, { kind: "stop" }>[];
    expect(stop?.reason).toBe("shard of an older generation is still running");
    expect(stop?.retire).toBe(false);
  });
});

describe("surplus and removal", () => {
  it("stops surplus replicas, not-ready and highest index first", () => {
    const w = new World(catalogOf(SMALL), { a: {}, b: {} });
    w.plan(0);
    w.report("ready", 1, (id) => id !== "llama-8b/1gpu/0");
    w.catalog = catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] });
    const actions = w.plan(2) as Extract<Action, { kind: "stop" }>[];
    expect(kinds(actions)).toEqual(["stop llama-8b/1gpu/0", "stop llama-8b/1gpu/2"]);
    expect(actions.every((a) => a.retire && a.mode === "stop")).toBe(true);
    expect(actions[0]?.reason).toBe("surplus: llama-8b/1gpu wants 1 replica(s), 3 running");
    // Once stopped, the slots disappear from the table.
    for (const id of ["llama-8b/1gpu/0", "llama-8b/1gpu/2"]) {
      const r = w.table.get(id)!;
      for (const s of r.retiring)
        w.table.observe(s.node, { replicaId: id, rank: s.rank, state: "stopped" }, 3);
    }
    expect(w.table.list().map((r) => r.id)).toEqual(["llama-8b/1gpu/1"]);
    expect(w.plan(4)).toEqual([]);
  });

  it("stops replicas of a profile that left the catalog", () => {
    const w = new World(catalogOf(SMALL), { a: {} });
    w.plan(0);
    w.catalog = catalogOf({ name: "llama-8b" });
    const actions = w.plan(1);
    expect(actions.map((a) => a.kind)).toEqual(["stop", "stop", "stop"]);
  });
});

describe("drain", () => {
  it("places the replacement first and drains the old shard once it is ready", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
      b: { allocated: [0, 1, 2, 3, 4, 5, 6] },
    });
    w.plan(0);
    const id0 = "llama-8b/1gpu/0";
    const node = w.table.get(id0)!.shards[0]!.node;
    expect(node).toBe("b");
    w.report("ready", 1);
    w.node("b").draining = true;
    const first = w.plan(10);
    expect(kinds(first)).toEqual(["place llama-8b/1gpu/1"]);
    expect((first[0] as Extract<Action, { kind: "place" }>).assignment.shards[0]!.node).toBe("a");
    // Replacement still starting: the old one keeps serving.
    expect(w.plan(20)).toEqual([]);
    w.report("ready", 30, (id) => id === "llama-8b/1gpu/1");
    const second = w.plan(40) as Extract<Action, { kind: "stop" }>[];
    expect(kinds(second)).toEqual([`stop ${id0}`]);
    expect(second[0]?.mode).toBe("drain");
    expect(second[0]?.reason).toBe("node b draining; 1 replacement(s) ready elsewhere");
  });

  it("keeps serving from a draining node with no room elsewhere until the deadline", () => {
    const w = new World(catalogOf({ ...SMALL, profiles: [{ ...SMALL.profiles[0], replicas: { min: 1 } }] }), {
      a: {},
    });
    w.plan(0);
    w.report("ready", 1);
    const a = w.node("a");
    a.draining = true;
    a.drainDeadline = 1000;
    expect(kinds(w.plan(10))).toEqual(["wait llama-8b/1gpu/1"]);
    const late = w.plan(1000);
    expect(kinds(late)).toEqual(["stop llama-8b/1gpu/0", "wait llama-8b/1gpu/1"]);
    expect((late[0] as Extract<Action, { kind: "stop" }>).mode).toBe("stop");
  });
});
