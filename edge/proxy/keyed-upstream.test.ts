import { afterEach, describe, expect, it } from "vitest";
import { type EndpointsDoc, endpointSpec, RoutingTable } from "../config/catalog.ts";
import { unionOf } from "../config/site-sets.ts";
import { SITE_INDEX_KEY } from "../config/site-store.ts";
import { ENDPOINTS_KEY, edgeConfig, endpointsKey, invalidateEdgeConfig } from "../config/store.ts";
import { keyedUpstream } from "./keyed-upstream.ts";
import type { UpstreamFetch } from "./upstream.ts";

const rec = (id: string, api_key?: string) => ({
  id,
  url: `http://${id}.test`,
  models: ["m"],
  pool: "default",
  weight: 1,
  priority: 0,
  via: "direct" as const,
  ...(api_key ? { api_key } : {}),
});

/** KV as the edge reads it, counting the reads. */
function fakeKv(docs: Record<string, unknown>) {
  const kv = {
    reads: 0,
    async get(key: string) {
      kv.reads++;
      return key in docs ? JSON.stringify(docs[key]) : null;
    },
  };
  return kv;
}

function recorder() {
  const sent: (string | null)[] = [];
  const direct: UpstreamFetch = async (_url, init) => {
    sent.push(new Headers(init.headers).get("authorization"));
    return new Response("ok");
  };
  return { sent, direct };
}

const tableOf = (sets: Map<string, EndpointsDoc>) =>
  new RoutingTable({ version: 0, models: [] }, unionOf(sets));

describe("keyedUpstream", () => {
  afterEach(invalidateEdgeConfig);

  it("sends each endpoint of the table its own key, a site's by its qualified id, with no read", async () => {
    const table = tableOf(
      new Map([
        ["default", { version: 1, endpoints: [rec("s1", "key-default"), rec("open")] }],
        ["eu", { version: 1, endpoints: [rec("s1", "key-eu")] }],
      ]),
    );
    const kv = fakeKv({});
    const env = { LLMGW_KV: kv as unknown as KVNamespace };
    const { sent, direct } = recorder();
    for (const e of table.endpointsFor("m").map(endpointSpec)) {
      await keyedUpstream(env, table, e, direct)(`${e.url}/v1/x`, { headers: {} });
    }
    expect(sent).toEqual(["Bearer key-default", null, "Bearer key-eu"]);
    expect(kv.reads).toBe(0);
    // Without a key, the seam's own fetch: nothing made per request.
    expect(keyedUpstream(env, table, endpointSpec(table.endpointsFor("m")[1]!), direct)).toBe(direct);
  });

  it("reads the set again for an endpoint the pool knows and the isolate's copy does not yet", async () => {
    const before = { version: 1, endpoints: [rec("old", "key-old")] };
    const after = { version: 2, endpoints: [rec("old", "key-old")] };
    const eu = { version: 1, endpoints: [rec("new", "key-new")] };
    const docs: Record<string, unknown> = { [ENDPOINTS_KEY]: before };
    const kv = fakeKv(docs);
    const env = { LLMGW_KV: kv as unknown as KVNamespace };
    const held = await edgeConfig(env);
    // EdgeSync wrote a new set (site eu's) and handed it to the pool; this isolate's copy is the old one.
    Object.assign(docs, {
      [ENDPOINTS_KEY]: after,
      [endpointsKey("eu")]: eu,
      [SITE_INDEX_KEY]: { sites: ["eu"] },
    });
    const leased = endpointSpec(unionOf(new Map([["eu", eu]])).endpoints[0]!);
    expect(leased.id).toBe("new@eu");
    const { sent, direct } = recorder();
    const reads = kv.reads;
    await keyedUpstream(env, held.table, leased, direct)("http://new.test/v1/x", { headers: {} });
    expect(sent).toEqual(["Bearer key-new"]);
    expect(kv.reads).toBeGreaterThan(reads);
    // The fresh copy is the isolate's now: the next request finds the endpoint without a read.
    const fresh = await edgeConfig(env);
    expect(fresh.table.engineKeyOf("new@eu")).toBe("key-new");
  });

  it("sends one that even a fresh read does not have without a key", async () => {
    const kv = fakeKv({ [ENDPOINTS_KEY]: { version: 1, endpoints: [rec("a", "key-a")] } });
    const env = { LLMGW_KV: kv as unknown as KVNamespace };
    const held = await edgeConfig(env);
    const { sent, direct } = recorder();
    await keyedUpstream(env, held.table, endpointSpec(rec("gone")), direct)("http://gone.test/v1/x", {});
    expect(sent).toEqual([null]);
  });
});
