import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO, waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type EdgeIsolates,
  setEndpoints,
  startEdgeIsolates,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * The router core with real processes: the edge in workerd as two isolates
 * over one set of Durable Objects (as two Cloudflare locations would be),
 * real sim engines, the official openai client. What one isolate's
 * requests teach the model's pool, the other's requests route by.
 */
afterAll(stopStarted);

const short = (n: number) => ({ role: "user" as const, content: `Hi ${n}.` });

/**
 * Opens a stream and reads its headers; the body stays unread until `finish`,
 * which hangs up. 64 tokens at 100 ms each keep it open for seconds, so a
 * loaded machine's slow step between two looks cannot see it end on its own.
 * Each in a session of its own, so it asks the pool (a session's turn is
 * admitted from no grant): the pool counts it by the time its headers come.
 */
async function openStream(url: string, key: TestKey, model: string, n: number) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${key.secret}`,
      "content-type": "application/json",
      "x-session-id": `stream-${n}`,
    },
    body: JSON.stringify({ model, messages: [short(n)], max_tokens: 64, stream: true }),
  });
  expect(res.status).toBe(200);
  return { endpoint: res.headers.get("x-llmgw-endpoint")!, finish: () => res.body?.cancel() };
}

async function poolOf(edge: EdgeIsolates, model: string) {
  const { pools } = await edge.sync.getPoolStatus({ model });
  return pools[0]!;
}

describe("one pool for every isolate", () => {
  let edge: EdgeIsolates;
  let key: TestKey;

  beforeAll(async () => {
    const [e, slowA, slowB, good] = await Promise.all([
      // A local override the pushed settings must not undo.
      startEdgeIsolates(2, { retries: 1 }),
      // Each token 100 ms late: a stream stays open long enough to be counted.
      startSim("slow", ["--sim-slow-token-ms", "100"]),
      startSim("slow", ["--sim-slow-token-ms", "100"]),
      startSim("brk"),
    ]);
    edge = e;
    await setEndpoints(edge, [
      { id: "slow-a", url: slowA.url, models: ["slow"] },
      { id: "slow-b", url: slowB.url, models: ["slow"] },
      // Nothing listens on port 9 of loopback: every attempt fails at once.
      { id: "dead", url: "http://127.0.0.1:9", models: ["brk"] },
      { id: "good", url: good.url, models: ["brk"] },
    ]);
    key = await createKey(edge, { band: "platinum" });
  }, 120_000);

  it("counts in flight across isolates: a request through the second goes where the first's is not", async () => {
    for (let trial = 0; trial < 5; trial++) {
      const first = await openStream(edge.urls[0]!, key, "slow", trial);
      const pool = await poolOf(edge, "slow");
      expect(pool.leases).toBe(1);
      const second = await openStream(edge.urls[1]!, key, "slow", 100 + trial);
      expect(second.endpoint).not.toBe(first.endpoint);
      expect((await poolOf(edge, "slow")).endpoints.map((e) => e.inflight).sort()).toEqual([1, 1]);
      await Promise.all([first.finish(), second.finish()]);
      await waitUntil("leases released", async () => (await poolOf(edge, "slow")).leases === 0, 10_000);
    }
  });

  it("shares breakers: failures seen through one isolate keep the other from trying a dead engine", async () => {
    const post = (url: string, n: number) =>
      clientFor({ url }, key.secret)
        .chat.completions.create({ model: "brk", messages: [short(n)], max_tokens: 2 })
        .withResponse();
    // Until the pool has seen failure_threshold failures of `dead`.
    await waitUntil(
      "dead's breaker open",
      async () => {
        const { response } = await post(edge.urls[0]!, 0);
        expect(response.status).toBe(200);
        return (await poolOf(edge, "brk")).endpoints.find((e) => e.id === "dead")?.breaker === "open";
      },
      30_000,
      0,
    );
    for (let i = 0; i < 10; i++) {
      const { response } = await post(edge.urls[1]!, i);
      expect([response.headers.get("x-llmgw-endpoint"), response.headers.get("x-llmgw-attempts")]).toEqual([
        "good",
        "1",
      ]);
    }
  });

  it("keeps a session on its endpoint and sends a shared prompt where its blocks were recorded", async () => {
    const client = clientFor({ url: edge.urls[0]! }, key.secret);
    const ask = (extra: Record<string, unknown>, headers: Record<string, string>) =>
      client.chat.completions
        .create({ model: "slow", max_tokens: 1, ...extra } as never, { headers })
        .withResponse();
    const s1 = await ask({ messages: [short(1)] }, { "x-session-id": "conversation-1" });
    const s2 = await ask({ messages: [short(2)] }, { "x-session-id": "conversation-1" });
    expect(s2.response.headers.get("x-llmgw-route")).toBe("session");
    expect(s2.response.headers.get("x-llmgw-endpoint")).toBe(s1.response.headers.get("x-llmgw-endpoint"));
    const system = { role: "system", content: "You answer questions about the llmgw gateway. ".repeat(30) };
    const p1 = await ask({ messages: [system, short(3)] }, {});
    const p2 = await ask({ messages: [system, short(4)] }, {});
    expect(p2.response.headers.get("x-llmgw-route")).toBe("prefix");
    expect(p2.response.headers.get("x-llmgw-endpoint")).toBe(p1.response.headers.get("x-llmgw-endpoint"));
    // p2 may have been admitted from the grant p1's answer brought: the pool counts it once told.
    await waitUntil(
      "routes counted",
      async () => {
        const { routes } = await poolOf(edge, "slow");
        return Number(routes.session) >= 1 && Number(routes.prefix) >= 1;
      },
      10_000,
    );
  });

  /**
   * `n` one-token streams through the first isolate, each read to its end
   * before the next; `between` runs after each. `sessions`: each in a session
   * of its own, so none is admitted from a grant. Returns how each was
   * admitted (`x-llmgw-admitted`).
   */
  async function oneAfterAnother(
    n: number,
    first: number,
    opts: { between?: (done: number) => Promise<unknown>; sessions?: boolean } = {},
  ) {
    const client = clientFor({ url: edge.urls[0]! }, key.secret);
    const admittedBy: (string | null)[] = [];
    for (let i = 0; i < n; i++) {
      const headers = opts.sessions ? { "x-session-id": `one-${first + i}` } : {};
      const { data: stream, response } = await client.chat.completions
        .create({ model: "slow", messages: [short(first + i)], max_tokens: 1, stream: true }, { headers })
        .withResponse();
      admittedBy.push(response.headers.get("x-llmgw-admitted"));
      for await (const _ of stream);
      await opts.between?.(i + 1);
    }
    return admittedBy;
  }

  const admitted = (p: Awaited<ReturnType<typeof poolOf>>) =>
    p.bands.reduce((sum, b) => sum + b.admitted, 0n);
  const fromGrants = (p: Awaited<ReturnType<typeof poolOf>>) => Number(p.grants!.used + p.grants!.late);
  /**
   * Until the pool has counted `done` admissions since `before` and holds no
   * lease: every release has arrived. (No lease alone is not enough: a request
   * admitted from a grant holds none until its use arrives, with its release.)
   */
  const allReleased = (before: Awaited<ReturnType<typeof poolOf>>) => (done: number) =>
    waitUntil(
      "releases arrived",
      async () => {
        const p = await poolOf(edge, "slow");
        return admitted(p) - admitted(before) === BigInt(done) && p.leases === 0;
      },
      10_000,
    );

  it("counts the calls Workers make to it: one request at a time, a release each, and an admit for each not admitted from a grant", async () => {
    await waitUntil("leases released", async () => (await poolOf(edge, "slow")).leases === 0, 10_000);
    const before = await poolOf(edge, "slow");
    const n = 6;
    const admittedBy = await oneAfterAnother(n, 200, { between: allReleased(before) });
    const after = await poolOf(edge, "slow");
    expect(admitted(after) - admitted(before)).toBe(BigInt(n));
    // One request at a time: each release is a call of its own, since nothing
    // else of the isolate is running to carry it; it carries the first-token
    // note and, for a request admitted from the grant its predecessor's call
    // brought, that grant's use. Every other request's admit is a call too.
    const granted = fromGrants(after) - fromGrants(before);
    expect(granted).toBeGreaterThanOrEqual(1);
    expect(Number(after.calls - before.calls)).toBe(n + (n - granted));
    // Each response says which it was.
    expect(admittedBy.filter((a) => a === "grant")).toHaveLength(granted);
    expect(admittedBy.filter((a) => a === "pool")).toHaveLength(n - granted);
  });

  it("one request at a time in sessions of their own: an admit and a release each", async () => {
    await waitUntil("leases released", async () => (await poolOf(edge, "slow")).leases === 0, 10_000);
    const before = await poolOf(edge, "slow");
    const n = 4;
    const admittedBy = await oneAfterAnother(n, 250, { between: allReleased(before), sessions: true });
    const after = await poolOf(edge, "slow");
    expect(fromGrants(after) - fromGrants(before)).toBe(0);
    expect(admittedBy).toEqual(Array(n).fill("pool"));
    expect(after.calls - before.calls).toBe(BigInt(2 * n));
  });

  it("while a stream runs in the isolate, each request's release rides with the next one's admit", async () => {
    await waitUntil("leases released", async () => (await poolOf(edge, "slow")).leases === 0, 10_000);
    const before = await poolOf(edge, "slow");
    const background = await openStream(edge.urls[0]!, key, "slow", 400);
    const n = 6;
    await oneAfterAnother(n, 300, { sessions: true });
    await background.finish();
    await waitUntil("leases released", async () => (await poolOf(edge, "slow")).leases === 0, 10_000);
    const after = await poolOf(edge, "slow");
    const calls = Number(after.calls - before.calls);
    // Two calls each (2n + 2) if no release rode. With every release that
    // could riding, n + 2: the admits, then the background's release, the
    // isolate's last, which takes the last short one's (or that one went
    // alone after RELEASE_RIDE_MS: n + 3). A release whose next admit came
    // later than that went alone, so only "fewer than two each" is certain.
    expect(calls).toBeGreaterThanOrEqual(n + 2);
    expect(calls).toBeLessThan(2 * n + 2);
  });

  it("takes the router settings the control plane pushes, validated, with LLMGW_ROUTER laid over them", async () => {
    await expect(
      edge.sync.putRouterSettings({ settingsJson: JSON.stringify({ admission: { queue_ttl: "soon" } }) }),
    ).rejects.toThrow(/router: admission\.queue_ttl: invalid duration "soon"/);
    await expect(
      edge.sync.putRouterSettings({ settingsJson: JSON.stringify({ retires: 3 }) }),
    ).rejects.toThrow(/retires: unknown key/);
    const { version } = await edge.sync.putRouterSettings({
      settingsJson: JSON.stringify({ admission: { default_band: "silver" }, retries: 3 }),
    });
    const got = await edge.sync.getRouterSettings({});
    expect(got.version).toBe(version);
    expect(JSON.parse(got.storedJson)).toEqual({ admission: { default_band: "silver" }, retries: 3 });
    expect(JSON.parse(got.effectiveJson)).toMatchObject({
      retries: 1,
      admission: { default_band: "silver" },
    });
    // A key with no default band of its own now runs in silver, in both isolates.
    const plain = await createKey(edge, { band: "platinum" });
    for (const url of edge.urls) {
      await waitUntil(
        "silver",
        async () => {
          const { response } = await clientFor({ url }, plain.secret)
            .chat.completions.create({ model: "slow", messages: [short(5)], max_tokens: 1 })
            .withResponse();
          return response.headers.get("x-llmgw-band") === "silver";
        },
        10_000,
      );
    }
  });
});

describe("fail-open", () => {
  let edge: EdgeIsolates;
  let key: TestKey;

  beforeAll(async () => {
    const [e, sim] = await Promise.all([
      startEdgeIsolates(
        1,
        {},
        {
          name: "unreachable-pool",
          config: join(REPO, "test", "fixtures", "unreachable-pool", "wrangler.toml"),
          entry: "worker.js",
          className: "UnreachablePool",
        },
      ),
      startSim("m"),
    ]);
    edge = e;
    await setEndpoints(edge, [{ id: "m-1", url: sim.url, models: ["m"] }]);
    key = await createKey(edge);
  }, 120_000);

  it("routes from the KV endpoint set when the pool cannot be reached, says so, and the pool counts it once back", async () => {
    const client = clientFor({ url: edge.urls[0]! }, key.secret);
    // Each in a session of its own: no grant the isolate holds admits it, every one asks the pool.
    let n = 0;
    const ask = () =>
      client.chat.completions
        .create(
          { model: "m", messages: [short(0)], max_tokens: 2 },
          { headers: { "x-session-id": `fail-open-${n++}` } },
        )
        .withResponse();
    const asked = (await ask()).response.headers;
    expect([asked.get("x-llmgw-route"), asked.get("x-llmgw-admitted")]).toEqual(["load", "pool"]);
    expect(await (await fetch(`${edge.extra["unreachable-pool"]}/down`, { method: "POST" })).text()).toBe(
      "down",
    );
    for (let i = 0; i < 3; i++) {
      const { data, response } = await ask();
      expect(data.usage?.completion_tokens).toBe(2);
      expect([
        response.headers.get("x-llmgw-route"),
        response.headers.get("x-llmgw-admitted"),
        response.headers.get("x-llmgw-endpoint"),
      ]).toEqual(["fail-open", "fail-open", "m-1"]);
    }
    await fetch(`${edge.extra["unreachable-pool"]}/up`, { method: "POST" });
    expect((await ask()).response.headers.get("x-llmgw-route")).toBe("load");
    expect((await poolOf(edge, "m")).failOpens).toBe(3n);
  });
});
