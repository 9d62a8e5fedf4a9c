import { describe, expect, it } from "vitest";
import { gpuNode, PORTS } from "../../test/fixtures/placement.ts";
import { buildCatalog, type Catalog } from "../catalog.ts";
import { configSchema } from "../config/schema.ts";
import { type DemandSignal, DemandWindow } from "../scaling/demand.ts";
import { plan, planSettings } from "./plan.ts";
import { type ScaleEvent, type ScaleMemory, scale, spread, verdict } from "./scale.ts";
import { ReplicaTable } from "./table.ts";
import type { Action } from "./types.ts";

const S = 1000;
const M = 60 * S;

function model(name: string, replicas: { min: number; max?: number }, extra: Record<string, unknown> = {}) {
  return {
    name,
    ...extra,
    profiles: [{ name: "1gpu", engine: "sim", source: `org/${name}`, replicas }],
  };
}

function catalogOf(models: Record<string, unknown>[], scaling: Record<string, unknown> = {}): Catalog {
  return buildCatalog(configSchema.parse({ scaling, models }));
}

const signal = (demand: number, o: Partial<DemandSignal> = {}): DemandSignal => ({
  demand,
  peak: demand,
  trendPerMs: 0,
  coveredMs: 60 * S,
  samples: 12,
  sources: [],
  ...o,
});

describe("the verdict on one model's demand (target 0.7 ± 0.1, window 60s, up 30s, down 5m)", () => {
  const m = catalogOf([model("m", { min: 1, max: 4 })]).get("m")!;
  const now = 100 * M;
  const event = (agoMs: number): ScaleEvent => ({ model: "m", at: now - agoMs, from: 1, to: 2, why: "" });
  const rows: {
    name: string;
    current: number;
    signal?: DemandSignal;
    loadMs?: number;
    lastAgo?: number;
    bounds?: { min: number; max: number };
    want: number;
    why: RegExp;
  }[] = [
    { name: "no signal holds", current: 2, want: 2, why: /^holding 2: no demand signal/ },
    {
      name: "half a window is needed before any decision",
      current: 1,
      signal: signal(3, { coveredMs: 20 * S }),
      want: 1,
      why: /covers 20s of the 60s window/,
    },
    {
      name: "over target + tolerance: up to demand / target",
      current: 2,
      signal: signal(2),
      want: 3,
      why: /demand 2\.00 puts 2 replica\(s\) at 1\.00, over 0\.80: up to 3/,
    },
    {
      name: "up at most doubles",
      current: 1,
      signal: signal(3.5),
      want: 2,
      why: /up to 2/,
    },
    { name: "never above max", current: 4, signal: signal(8), want: 4, why: /but 4 is replicas.max/ },
    {
      name: "inside the dead band holds",
      current: 2,
      signal: signal(1.55),
      want: 2,
      why: /holding 2: demand 1\.55 puts them at 0\.78, within 0\.60\.\.0\.80/,
    },
    {
      name: "one fewer would still be under target - tolerance: down",
      current: 3,
      signal: signal(1.1),
      lastAgo: 10 * M,
      want: 2,
      why: /demand 1\.10 \(peak 1\.10\) puts 2 replica\(s\) at 0\.55, under 0\.60: down to 2/,
    },
    {
      name: "a scale-down must hold against the window's busiest sample too",
      current: 3,
      signal: signal(1.1, { peak: 1.5 }),
      lastAgo: 10 * M,
      want: 3,
      why: /holding 3/,
    },
    {
      name: "one fewer would be over target - tolerance: hold",
      current: 3,
      signal: signal(1.3),
      want: 3,
      why: /holding 3/,
    },
    {
      name: "down waits out the scale-down cool-down",
      current: 3,
      signal: signal(0.2),
      lastAgo: 2 * M,
      want: 3,
      why: /down waits for the cool-down \(180s left\)/,
    },
    {
      name: "down one replica at a time, however low the demand",
      current: 4,
      signal: signal(0.1),
      lastAgo: 10 * M,
      want: 3,
      why: /down to 3/,
    },
    { name: "never below min", current: 1, signal: signal(0.05), want: 1, why: /or at replicas.min/ },
    {
      name: "up waits out the scale-up cool-down",
      current: 2,
      signal: signal(3),
      lastAgo: 10 * S,
      want: 2,
      why: /up waits for the cool-down \(20s left\)/,
    },
    {
      name: "a long load asks early on a rising trend, extrapolated no further than the window",
      current: 2,
      // 1.4 now (0.70 each), rising 0.5 replicas a minute; the load takes 2 minutes but
      // the window measured only 1: 1.9 ahead, 0.95 each.
      signal: signal(1.4, { trendPerMs: 0.5 / M }),
      loadMs: 2 * M,
      want: 3,
      why: /demand 1\.40, 1\.90 in 60s of loading puts 2 replica\(s\) at 0\.95, over 0\.80: up to 3/,
    },
    {
      name: "the same trend with an instant load waits",
      current: 2,
      signal: signal(1.4, { trendPerMs: 0.5 / M }),
      want: 2,
      why: /holding 2/,
    },
    {
      name: "a falling trend never shrinks early",
      current: 3,
      signal: signal(1.3, { trendPerMs: -1 / M }),
      loadMs: 2 * M,
      lastAgo: 10 * M,
      want: 3,
      why: /holding 3/,
    },
    {
      name: "min = max is today's fixed count",
      current: 3,
      signal: signal(9),
      bounds: { min: 2, max: 2 },
      want: 2,
      why: /^fixed: replicas.min = replicas.max = 2/,
    },
  ];
  for (const r of rows) {
    it(r.name, () => {
      const v = verdict(
        m,
        r.bounds ?? { min: 1, max: 4 },
        r.current,
        r.signal,
        r.loadMs ?? 0,
        r.lastAgo === undefined ? undefined : event(r.lastAgo),
        now,
      );
      expect(v.want).toBe(r.want);
      expect(v.why).toMatch(r.why);
    });
  }

  it("disabled keeps min whatever the demand", () => {
    const off = catalogOf([model("m", { min: 1, max: 4 }, { scaling: { enabled: false } })]).get("m")!;
    expect(verdict(off, { min: 1, max: 4 }, 3, signal(9), 0, undefined, now)).toEqual({
      want: 1,
      why: "fixed at replicas.min 1: scaling is disabled",
    });
  });
});

describe("spread over profiles", () => {
  it("fills each profile from its min to its max in config order", () => {
    const c = catalogOf([
      {
        name: "m",
        profiles: [
          { name: "a", engine: "sim", source: "x", replicas: { min: 1, max: 2 } },
          { name: "b", engine: "sim", source: "x", replicas: { min: 0, max: 3 } },
        ],
      },
    ]);
    const m = c.get("m")!;
    expect([...spread(m, 1)]).toEqual([
      ["m/a", 1],
      ["m/b", 0],
    ]);
    expect([...spread(m, 4)]).toEqual([
      ["m/a", 2],
      ["m/b", 2],
    ]);
  });
});

/** A table of running replicas, each ready, on one node of `gpus` GPUs. */
function fleet(catalog: Catalog, running: Record<string, number>, gpus: number) {
  const table = new ReplicaTable();
  const nodes = [gpuNode("a", { gpus })];
  const settings = planSettings(configSchema.parse({}).control);
  const desired = new Map(Object.entries(running).map(([m, n]) => [`${m}/1gpu`, n]));
  const actions = plan({ ...table.planState(catalog, nodes, settings), desired }, 0);
  table.apply(actions, 0);
  for (const r of table.list())
    for (const s of r.shards)
      table.observe(s.node, { replicaId: r.id, rank: s.rank, generation: r.generation, state: "ready" }, 1);
  return { table, nodes, settings };
}

describe("GPUs short: a higher priority takes replicas above min from a lower one", () => {
  const now = 10 * M;
  const scenario = (lowMin: number, lowRunning: number, gpus: number) => {
    const catalog = catalogOf([
      model("high", { min: 1, max: 4 }, { priority: 10 }),
      model("low", { min: lowMin, max: 4 }),
    ]);
    const { table, nodes } = fleet(catalog, { high: 1, low: lowRunning }, gpus);
    const memory = new Map<string, ScaleMemory>([
      ["high", { desired: 1 }],
      ["low", { desired: lowRunning }],
    ]);
    const signals = new Map([
      // high: 2.1 replicas of demand on 1 = 2.10 each: up to 3.
      ["high", { signal: signal(2.1), sources: [] }],
      ["low", { signal: signal(0.7 * lowRunning), sources: [] }],
    ]);
    return scale({ catalog, nodes, replicas: table.list(), portRange: PORTS, signals, memory }, now);
  };

  it("free GPUs first: nothing is taken when the new replicas fit", () => {
    const out = scenario(1, 3, 8);
    expect(out.desired.get("high/1gpu")).toBe(2);
    expect(out.desired.get("low/1gpu")).toBe(3);
    expect(out.events.map((e) => `${e.model} ${e.from}→${e.to}`)).toEqual(["high 1→2"]);
  });

  it("takes only as many as its new replicas need", () => {
    // 4 GPUs: high 1 + low 3, all taken; high wants 2 (doubling cap): one from low.
    const out = scenario(1, 3, 4);
    expect(out.desired.get("high/1gpu")).toBe(2);
    expect(out.desired.get("low/1gpu")).toBe(2);
    expect(out.models.get("low")!.why).toBe("gives a replica to high (priority 10 over 0): GPUs are short");
  });

  it("never takes a lower model below its min", () => {
    const out = scenario(3, 3, 4);
    expect(out.desired.get("low/1gpu")).toBe(3);
    // high still asks: its replica waits for room, and the plan says so.
    expect(out.desired.get("high/1gpu")).toBe(2);
  });

  it("equal priority takes nothing", () => {
    const catalog = catalogOf([model("a", { min: 1, max: 4 }), model("b", { min: 1, max: 4 })]);
    const { table, nodes } = fleet(catalog, { a: 1, b: 3 }, 4);
    const out = scale(
      {
        catalog,
        nodes,
        replicas: table.list(),
        portRange: PORTS,
        signals: new Map([["a", { signal: signal(2.1), sources: [] }]]),
        memory: new Map([["b", { desired: 3 }]]),
      },
      now,
    );
    expect(out.desired.get("b/1gpu")).toBe(3);
  });

  it("a replica already draining for it counts as freed: no second victim", () => {
    const catalog = catalogOf([
      model("high", { min: 1, max: 4 }, { priority: 10 }),
      model("low", { min: 1, max: 4 }),
    ]);
    const { table, nodes, settings } = fleet(catalog, { high: 1, low: 3 }, 4);
    const first = scenario(1, 3, 4);
    const actions = plan({ ...table.planState(catalog, nodes, settings), desired: first.desired }, now);
    const drains = actions.filter((a): a is Extract<Action, { kind: "stop" }> => a.kind === "stop");
    expect(drains.map((a) => [a.replicaId, a.mode])).toEqual([["low/1gpu/2", "drain"]]);
    table.apply(actions, now);
    const again = scale(
      {
        catalog,
        nodes,
        replicas: table.list(),
        portRange: PORTS,
        signals: new Map([["high", { signal: signal(2.1), sources: [] }]]),
        memory: first.memory,
      },
      now + 5 * S,
    );
    expect(again.desired.get("low/1gpu")).toBe(2);
    expect(again.events).toEqual([]);
  });
});

describe("scale-down through the plan", () => {
  it("drains the surplus serving replica; replicas beyond max still stop", () => {
    const catalog = catalogOf([model("m", { min: 1, max: 3 })]);
    const { table, nodes, settings } = fleet(catalog, { m: 3 }, 8);
    const actions = plan(
      { ...table.planState(catalog, nodes, settings), desired: new Map([["m/1gpu", 2]]) },
      5,
    );
    expect(actions).toEqual([
      expect.objectContaining({
        kind: "stop",
        replicaId: "m/1gpu/2",
        mode: "drain",
        retire: true,
        reason: "scale down: m/1gpu wants 2 replica(s), 3 running",
      }),
    ]);
    const lowered = catalogOf([model("m", { min: 1, max: 1 })]);
    const stops = plan(
      { ...table.planState(lowered, nodes, settings), desired: new Map([["m/1gpu", 1]]) },
      5,
    ) as Extract<Action, { kind: "stop" }>[];
    expect(stops.map((a) => a.mode)).toEqual(["stop", "stop"]);
  });
});

describe("a noisy signal does not flap", () => {
  /** Two hours of 5 s passes on demand wandering ±30% around 1.4 replicas (0.70 each at 2). */
  function run(scaling: Record<string, unknown>, peakGuard = true): ScaleEvent[] {
    const catalog = catalogOf([model("m", { min: 1, max: 6 })], scaling);
    const m = catalog.get("m")!;
    let seed = 7;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed / 2 ** 31;
    };
    const window = new DemandWindow();
    let memory = new Map<string, ScaleMemory>();
    const events: ScaleEvent[] = [];
    for (let t = 0; t <= 2 * 60 * M; t += 5 * S) {
      window.add(
        { at: t, demand: 1.4 * (1 + (rand() - 0.5) * 0.6), ready: 2, sources: [] },
        m.scaling.windowMs,
      );
      const out = scale(
        {
          catalog,
          nodes: [gpuNode("a")],
          replicas: [],
          portRange: PORTS,
          signals: new Map([["m", { signal: guarded(window.signal()), sources: [] }]]),
          memory,
        },
        t,
      );
      memory = out.memory;
      events.push(...out.events);
    }
    return events;
    function guarded(sig: DemandSignal | undefined) {
      return sig && !peakGuard ? { ...sig, peak: sig.demand } : sig;
    }
  }

  it("with the defaults: at most 6 events an hour, and no reversal inside the scale-down cool-down", () => {
    const events = run({});
    expect(events.length).toBeGreaterThan(0);
    expect(events.length).toBeLessThanOrEqual(12);
    for (let i = 1; i < events.length; i++) {
      const [a, b] = [events[i - 1]!, events[i]!];
      const reversal = Math.sign(a.to - a.from) !== Math.sign(b.to - b.from);
      if (reversal) expect(b.at - a.at).toBeGreaterThanOrEqual(5 * M);
    }
    expect(events.every((e) => e.to >= 2 && e.to <= 3)).toBe(true);
  });

  it("without the dead band, the cool-downs and the peak guard the same signal flaps (what the test guards against)", () => {
    const events = run({ tolerance: 0, scale_up_cooldown: "0s", scale_down_cooldown: "0s" }, false);
    expect(events.length).toBeGreaterThan(50);
  });
});
