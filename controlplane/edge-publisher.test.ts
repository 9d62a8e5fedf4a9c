import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import type { EdgeSyncClient } from "../common/edgesync-client.ts";
import { createLogger } from "../common/log.ts";
import { type Endpoint, EndpointSchema } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { buildCatalog } from "./catalog.ts";
import { configSchema } from "./config/schema.ts";
import { type EdgeFacts, EdgePublisher, endpointSet, PublishedEndpoints } from "./edge-publisher.ts";
import type { ReplicaRecord, TrackedState } from "./reconcile/types.ts";

const endpoint = (id: string, host: string) =>
  create(EndpointSchema, {
    id,
    url: `http://${host}:20000`,
    models: [id.split("/")[0]!],
    pool: "default",
    weight: 1,
    via: "direct",
  });

function replica(id: string, node: string, state: TrackedState): ReplicaRecord {
  return {
    id,
    model: id.split("/")[0]!,
    profile: "p",
    index: 0,
    generation: 1,
    shards: [{ rank: 0, node, gpus: [0], ports: { http: 20000, distInit: [] }, state, since: 0 }],
    worldNodes: 1,
    retiring: [],
    retire: false,
    origin: "reported",
    adopted: true,
    restarts: 0,
  };
}

/** A publisher against a recording EdgeSync client, at a clock the test moves. */
async function harness(stored: Endpoint[] | undefined) {
  const puts: string[][] = [];
  const store = new PublishedEndpoints(":memory:");
  if (stored) store.save(stored, 0);
  const client = {
    putCatalog: async () => ({ version: 1n }),
    putRouterSettings: async () => ({ version: 1n }),
    putEndpointSets: async (r: { endpoints: Endpoint[] }) => {
      puts.push(r.endpoints.map((e) => e.id));
      return { version: BigInt(puts.length) };
    },
    pushLoad: async () => ({}),
  } as unknown as EdgeSyncClient;
  const facts: EdgeFacts = {
    replicas: [],
    address: (n) => n,
    load: () => undefined,
    staticEndpoints: [],
    via: "direct",
    now: 0,
  };
  const p = new EdgePublisher({
    client,
    log: createLogger({}, "error"),
    facts: () => facts,
    loadRefreshMs: 1_000,
    graceUntil: 5_000,
    holdUntil: 60_000,
    store,
  });
  const first = p.start(buildCatalog(configSchema.parse({})), {});
  p.stop();
  await first;
  return { p, puts, facts, store };
}

describe("the endpoint set", () => {
  it("carries each ready replica's engine key, for the generation it runs", () => {
    const facts: EdgeFacts = {
      replicas: [replica("m/p/0", "n1", "ready")],
      address: (n) => n,
      load: () => undefined,
      staticEndpoints: [],
      via: "direct",
      now: 0,
    };
    expect(
      endpointSet({ ...facts, engineKey: (id, generation) => `key-of-${id}@${generation}` })[0]?.apiKey,
    ).toBe("key-of-m/p/0@1");
    expect(endpointSet(facts)[0]?.apiKey).toBe("");
  });
});

describe("EdgePublisher after a restart", () => {
  it("keeps what the edge has until an agent reports the replica or the hold ends", async () => {
    const { p, puts, facts, store } = await harness([endpoint("a/p/0", "n1"), endpoint("b/p/0", "n2")]);
    await p.tick();
    // No agent back yet: the edge gets what it had, not an empty set.
    expect(puts).toEqual([["a/p/0", "b/p/0"]]);

    // n1 is back with a running replica: same set, nothing written.
    facts.replicas = [replica("a/p/0", "n1", "ready")];
    facts.now = 2_000;
    await p.tick();
    expect(puts).toHaveLength(1);

    // n2 reports its replica failed: that one goes, before the hold ends.
    facts.replicas = [replica("a/p/0", "n1", "ready"), replica("b/p/0", "n2", "failed_running")];
    facts.now = 3_000;
    await p.tick();
    expect(puts.at(-1)).toEqual(["a/p/0"]);
    expect(store.load().endpoints?.map((e) => e.id)).toEqual(["a/p/0"]);
  });

  it("drops a replica it has itself stopped and forgotten during the hold, keeping the ones no agent reported", async () => {
    const { p, puts, facts } = await harness([endpoint("a/p/0", "n1"), endpoint("b/p/0", "n2")]);
    facts.replicas = [replica("a/p/0", "n1", "ready"), replica("a/p/1", "n1", "ready")];
    facts.now = 1_000;
    await p.tick();
    expect(puts.at(-1)).toEqual(["a/p/0", "a/p/1", "b/p/0"]);
    // A rollout (or a scale-down) drained a/p/0 and a/p/1 and forgot them: long before the hold ends.
    facts.replicas = [replica("a/p/2", "n1", "ready")];
    facts.now = 2_000;
    await p.tick();
    expect(puts.at(-1)).toEqual(["a/p/2", "b/p/0"]);
  });

  it("names a stored set that does not decode, and reads it as none", () => {
    const store = new PublishedEndpoints(":memory:");
    expect(store.load()).toEqual({ endpoints: undefined });
    const row = (store as unknown as { row: { write(b: Uint8Array, at: number): void } }).row;
    row.write(new Uint8Array([0xff, 0xff, 0xff]), 1);
    const r = store.load();
    expect(r.endpoints).toBeUndefined();
    expect(r.error).toMatch(/^edge_endpoint_set does not decode: /);
  });

  it("drops what no agent reported once the hold is over", async () => {
    const { p, puts, facts } = await harness([endpoint("a/p/0", "n1"), endpoint("b/p/0", "n2")]);
    facts.replicas = [replica("a/p/0", "n1", "ready")];
    facts.now = 59_999;
    await p.tick();
    expect(puts).toEqual([["a/p/0", "b/p/0"]]);
    facts.now = 60_000;
    await p.tick();
    expect(puts.at(-1)).toEqual(["a/p/0"]);
  });

  it("with nothing stored, publishes no endpoint set during the startup grace", async () => {
    const { p, puts, facts } = await harness(undefined);
    facts.replicas = [replica("a/p/0", "n1", "ready")];
    await p.tick();
    expect(puts).toEqual([]);
    facts.now = 5_000;
    await p.tick();
    expect(puts).toEqual([["a/p/0"]]);
  });
});

describe("EdgePublisher for a site", () => {
  it("publishes its set and load as its site's, and takes the edge's refusal of the catalog and router settings as not its to publish", async () => {
    const calls: string[] = [];
    const denied = () => Promise.reject(new ConnectError("site token", Code.PermissionDenied));
    const client = {
      putCatalog: () => {
        calls.push("catalog");
        return denied();
      },
      putRouterSettings: () => {
        calls.push("router");
        return denied();
      },
      putEndpointSets: async (r: { site: string }) => {
        calls.push(`set:${r.site}`);
        return { version: 1n };
      },
      pushLoad: async (r: { site: string }) => {
        calls.push(`load:${r.site}`);
        return {};
      },
    } as unknown as EdgeSyncClient;
    const r = replica("m/p/0", "n1", "ready");
    const facts: EdgeFacts = {
      replicas: [r],
      address: (n) => n,
      load: () =>
        ({ waiting: 0, running: 1, kvUsage: 0, prefixCacheHitRate: 0, scrapedAtUnixMs: 1n }) as never,
      staticEndpoints: [],
      via: "direct",
      now: 0,
    };
    const p = new EdgePublisher({
      client,
      log: createLogger({}, "error"),
      facts: () => facts,
      loadRefreshMs: 1_000,
      site: "eu",
    });
    const first = p.start(buildCatalog(configSchema.parse({})), {});
    p.stop();
    await first;
    expect(calls).toEqual(["catalog", "router", "set:eu", "load:eu"]);
    expect(p.failures).toBe(0);
    // Not asked again until the catalog changes.
    await p.tick();
    expect(calls.filter((c) => c === "catalog")).toHaveLength(1);
  });
});
