import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseEndpointsFile } from "../../cli/ctl/endpoints.ts";
import { checkCatalogNames } from "../../common/catalog-names.ts";
import { runLlmgw, waitUntil } from "../harness/process.ts";
import { clientFor, type Edge, type Sim, startEdge, startSim, stopStarted } from "./helpers.ts";

/**
 * The operator's side: `llmgw keys ...` and `llmgw ctl endpoints set` over
 * EdgeSync against the real edge, plus EdgeSync's own guard.
 */
describe("keys and endpoints CLI", () => {
  let edge: Edge;
  let sim: Sim;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    // An engine run by hand that knows its model by a name of its own.
    [edge, sim] = await Promise.all([
      startEdge(),
      startSim("hand", ["--served-model-name", "org/hand-engine"]),
    ]);
    env = { LLMGW_EDGE_TOKEN: edge.token };
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  it("router-only mode: endpoints from a YAML file, then keys create/list/usage/revoke", async () => {
    const file = join(tmpdir(), `endpoints-${process.pid}.yaml`);
    writeFileSync(
      file,
      `- id: hand-1\n  url: ${sim.url}\n  models: [hand]\n  served_model_name: org/hand-engine\n`,
    );
    const set = await runLlmgw(["ctl", "endpoints", "set", file, "--edge", edge.url], env);
    expect(set.stderr).toBe("");
    expect(set.stdout).toMatch(/wrote 1 endpoints .* \(version 1\)/);

    const created = await runLlmgw(
      [
        "keys",
        "create",
        "--name",
        "ci",
        "--band",
        "silver",
        "--tenant",
        "t1",
        "--rpm",
        "100",
        "--budget",
        "5000/1d",
        "--edge",
        edge.url,
      ],
      env,
    );
    expect(created.code).toBe(0);
    const id = /id:\s+(\S+)/.exec(created.stdout)![1]!;
    const secret = /secret:\s+(sk-\S+)/.exec(created.stdout)![1]!;
    expect(created.stderr).toMatch(/shown only now/);

    const client = clientFor(edge, secret);
    const { response } = await client.chat.completions
      .create({ model: "hand", messages: [{ role: "user", content: "hi" }], max_tokens: 3 })
      .withResponse();
    expect(response.headers.get("x-llmgw-band")).toBe("silver");

    const list = await runLlmgw(["keys", "list", "--json", "--edge", edge.url], env);
    const keys = JSON.parse(list.stdout);
    const mine = keys.find((k: { id: string }) => k.id === id);
    expect(mine).toMatchObject({
      name: "ci",
      tenant: "t1",
      max_band: "silver",
      rpm: 100,
      budget: { tokens: 5000, period: "1d" },
    });
    expect(list.stdout).not.toContain(secret);

    const usage = await runLlmgw(["keys", "usage", id, "--json", "--edge", edge.url], env);
    const [u] = JSON.parse(usage.stdout);
    // The engine counted the tokens itself: nothing is an estimate.
    expect(u).toMatchObject({
      id,
      requests: 1,
      completion_tokens: 3,
      estimated_requests: 0,
      estimated_tokens: 0,
    });
    expect(u.budget_used).toBe(u.total_tokens);

    const table = await runLlmgw(["keys", "list", "--edge", edge.url], env);
    expect(table.stdout).toMatch(/^ID\s+NAME\s+TENANT\s+BAND\s+DEFAULT BAND\s+MODELS/);
    // No --default-band: the router's default applies, clamped to silver.
    expect(table.stdout).toMatch(new RegExp(`^${id}\\s+ci\\s+t1\\s+silver\\s+router's\\s`, "m"));

    expect((await runLlmgw(["keys", "revoke", id, "--edge", edge.url], env)).code).toBe(0);
    await expect(
      client.chat.completions.create({ model: "hand", messages: [{ role: "user", content: "hi" }] }),
    ).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  }, 60_000);

  it("keys update changes a key in place: same secret, new limits at once; a revoked key stays revoked", async () => {
    const keys = (...args: string[]) => runLlmgw(["keys", ...args, "--edge", edge.url], env);
    const created = await keys(
      "create",
      "--name",
      "grows",
      "--band",
      "silver",
      "--rpm",
      "1",
      "--budget",
      "900/1d",
    );
    const id = /id:\s+(\S+)/.exec(created.stdout)![1]!;
    const client = clientFor(edge, /secret:\s+(sk-\S+)/.exec(created.stdout)![1]!);
    const ask = () =>
      client.chat.completions
        .create({ model: "hand", messages: [{ role: "user", content: "hi" }], max_tokens: 2 })
        .withResponse();
    expect((await ask()).response.headers.get("x-llmgw-band")).toBe("silver");
    await expect(ask()).rejects.toMatchObject({ status: 429, code: "rate_limit_exceeded" });

    const updated = await keys("update", id, "--rpm", "5", "--band", "gold", "--budget", "none");
    expect(updated.stderr).toBe("");
    expect(updated.stdout.split("\n")).toEqual(
      expect.arrayContaining([
        `updated ${id}`,
        "  max_band: silver → gold",
        "  rpm: 1 → 5",
        "  budget: 900/1d → -",
      ]),
    );
    // The same secret, at once: the band the key now allows, and room under the new RPM.
    const after = await ask();
    expect(after.response.headers.get("x-llmgw-band")).toBe("gold");
    expect(after.response.headers.get("x-ratelimit-limit-requests")).toBe("5");
    const [listed] = JSON.parse((await keys("list", "--json")).stdout).filter(
      (k: { id: string }) => k.id === id,
    );
    expect(listed).toMatchObject({ name: "grows", max_band: "gold", rpm: 5, budget: null });

    for (const [args, message] of [
      [[id], /nothing to change/],
      [["key_nosuch", "--rpm", "2"], /no key with id key_nosuch/],
      [[id, "--band", "diamond"], /key\.max_band: must be one of platinum, gold, silver, bronze/],
      [[id, "--rpm", "lots"], /--rpm: expected a whole number, got "lots"/],
    ] as const) {
      const r = await keys("update", ...args);
      expect([r.code, r.stderr]).toEqual([1, expect.stringMatching(message)]);
    }

    expect((await keys("revoke", id)).code).toBe(0);
    const late = await keys("update", id, "--rpm", "50");
    expect([late.code, late.stderr]).toEqual([1, expect.stringMatching(/is revoked; create a new key/)]);
    // Nor can a PutKey of the record marked active bring it back.
    const record = (await edge.sync.listKeys({})).keys.find((k) => k.id === id)!;
    await expect(edge.sync.putKey({ key: { ...record, revoked: false } })).rejects.toThrow(/is revoked/);
    // Nor under another id: the secret is the revoked key's.
    await expect(edge.sync.putKey({ key: { ...record, id: "key_reborn", revoked: false } })).rejects.toThrow(
      new RegExp(`this secret already belongs to key ${id}`),
    );
    await expect(ask()).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  }, 60_000);

  it("a key with --expires gets 401 from then on, until update moves its expiry", async () => {
    const keys = (...args: string[]) => runLlmgw(["keys", ...args, "--edge", edge.url], env);
    const created = await keys("create", "--name", "trial", "--band", "gold", "--expires", "1h");
    expect(created.code).toBe(0);
    const id = /id:\s+(\S+)/.exec(created.stdout)![1]!;
    const client = clientFor(edge, /secret:\s+(sk-\S+)/.exec(created.stdout)![1]!);
    const ask = () =>
      client.chat.completions
        .create({ model: "hand", messages: [{ role: "user", content: "hi" }], max_tokens: 2 })
        .then(
          () => "ok",
          (e: unknown) => (e instanceof OpenAI.AuthenticationError ? e.message : String(e)),
        );
    expect(await ask()).toBe("ok");
    const expiry = async () =>
      JSON.parse((await keys("list", "--json")).stdout).find((k: { id: string }) => k.id === id) as {
        created_at: string;
        expires_at: string;
      };
    const listed = await expiry();
    expect(Date.parse(listed.expires_at) - Date.parse(listed.created_at)).toBe(3_600_000);
    // Brought forward to a moment from now: the same secret stops working then.
    expect((await keys("update", id, "--expires", "2s")).code).toBe(0);
    const at = Date.parse((await expiry()).expires_at);

    const refused = await waitUntil("the key expired", async () => {
      const r = await ask();
      return r !== "ok" && r;
    });
    expect(refused).toBe(`401 This API key expired at ${new Date(at).toISOString()}.`);
    expect(Date.now()).toBeGreaterThanOrEqual(at);
    expect((await keys("list")).stdout).toMatch(new RegExp(`^${id}\\s.*\\sexpired\\s*$`, "m"));

    const moved = await keys("update", id, "--expires", "1h");
    expect(moved.stdout).toMatch(/expires_at: \S+ → \S+/);
    expect(await ask()).toBe("ok");
    expect((await keys("update", id, "--expires", "never")).stdout).toMatch(/expires_at: \S+ → -/);
    for (const [args, message] of [
      [["create", "--name", "x", "--band", "gold", "--expires", "2001-01-01"], /is not in the future/],
      [
        ["create", "--name", "x", "--band", "gold", "--expires", "never"],
        /--expires: expected a duration such as 30d, .*09:00:00Z, got "never"/,
      ],
      [["update", id, "--expires", "soon"], /--expires: expected a duration .*, or never, got "soon"/],
    ] as const) {
      const r = await keys(...args);
      expect([r.code, r.stderr]).toEqual([1, expect.stringMatching(message)]);
    }
  }, 60_000);

  it("empties the edge's endpoint set only with --allow-empty", async () => {
    const empty = join(tmpdir(), `no-endpoints-${process.pid}.yaml`);
    writeFileSync(empty, "[]\n");
    // Every model's pool: once no endpoint names it, the edge no longer knows "hand".
    const endpointsAtEdge = async () => {
      const pool = (await edge.sync.getPoolStatus({})).pools.find((p) => p.model === "hand");
      return { version: pool?.endpointsVersion, ids: pool?.endpoints.map((e) => e.id) ?? [] };
    };
    const before = await endpointsAtEdge();
    expect(before.ids).toEqual(["hand-1"]);

    const refused = await runLlmgw(["ctl", "endpoints", "set", empty, "--edge", edge.url], env);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /endpoints: empty, and would remove all 1 endpoints of version \d+; .*--allow-empty/,
    );
    expect(await endpointsAtEdge()).toEqual(before);

    const meant = await runLlmgw(
      ["ctl", "endpoints", "set", empty, "--allow-empty", "--edge", edge.url],
      env,
    );
    expect(meant.stderr).toBe("");
    expect(meant.stdout).toMatch(/wrote 0 endpoints/);
    expect((await endpointsAtEdge()).ids).toEqual([]);
    // Nothing left to remove: an empty set over an empty one needs no flag.
    const again = await runLlmgw(["ctl", "endpoints", "set", empty, "--edge", edge.url], env);
    expect(again.code).toBe(0);

    const file = join(tmpdir(), `endpoints-${process.pid}.yaml`);
    expect((await runLlmgw(["ctl", "endpoints", "set", file, "--edge", edge.url], env)).code).toBe(0);
    expect((await endpointsAtEdge()).ids).toEqual(["hand-1"]);
  });

  it("refuses a bad endpoints file with path-named errors, before contacting the edge", async () => {
    const file = join(tmpdir(), `bad-endpoints-${process.pid}.yaml`);
    writeFileSync(
      file,
      "- id: a\n  url: ftp://x\n  models: []\n- id: a\n  url: http://ok:1\n  models: [m]\n  weight: -1\n  colour: red\n",
    );
    const r = await runLlmgw(["ctl", "endpoints", "set", file, "--edge", "http://127.0.0.1:1"], env);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/endpoints\[0\]\.url/);
    expect(r.stderr).toMatch(/endpoints\[0\]\.models/);
    expect(r.stderr).toMatch(/endpoints\[1\]\.weight/);
    expect(r.stderr).toMatch(/endpoints\[1\]\.colour: unknown key/);
    expect(r.stderr).toMatch(/endpoints\[1\]\.id: duplicate id/);
    writeFileSync(file, "- id: a\n  url: http://ok:1\n  models: [m]\n");
    const v = await runLlmgw(
      ["ctl", "endpoints", "set", file, "--version", "1.5", "--edge", "http://127.0.0.1:1"],
      env,
    );
    expect([v.code, v.stderr]).toEqual([
      2,
      'llmgw: --version: "1.5" is not a whole number of at most 18 digits\n',
    ]);
  });

  it("parses the example endpoints file", async () => {
    const { readFileSync } = await import("node:fs");
    const eps = parseEndpointsFile(readFileSync("infra/examples/endpoints.yaml", "utf8"), "example");
    expect(eps.map((e) => e.via)).toEqual(["vpc", "vpc", "tunnel", "direct"]);
  });

  it("EdgeSync refuses a missing or wrong bearer token", async () => {
    const wrong = await runLlmgw(["keys", "list", "--edge", edge.url], { LLMGW_EDGE_TOKEN: "nope" });
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toMatch(/bearer token/);
    const raw = await fetch(`${edge.url}/edge.v1.EdgeSyncService/ListKeys`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(raw.status).toBe(401);
  });

  it("EdgeSync validates what it stores and versions documents", async () => {
    await expect(
      edge.sync.putEndpointSets({ endpoints: [{ id: "x", url: "not a url", models: ["m"] }] }),
    ).rejects.toThrow(/endpoints\[0\]\.url/);
    await expect(
      edge.sync.putCatalog({ models: [{ name: "a", aliases: [], fallbacks: ["missing"], routing: "" }] }),
    ).rejects.toThrow(/fallbacks/);
    // The control plane's own rules and words: a self-fallback and a cycle are refused too.
    const looped = [
      { name: "a", aliases: ["first"], fallbacks: ["first"], routing: "" },
      { name: "b", aliases: [], fallbacks: ["c"], routing: "" },
      { name: "c", aliases: [], fallbacks: ["b"], routing: "" },
    ];
    await expect(edge.sync.putCatalog({ models: looped })).rejects.toThrow(
      checkCatalogNames(looped).issues.join("; "),
    );
    expect(checkCatalogNames(looped).issues).toEqual([
      'models[0].fallbacks[0]: "first" is this model itself',
      "models[1].fallbacks: fallback cycle b → c → b",
    ]);
    await expect(
      edge.sync.putCatalog({ models: [{ name: "a\r\nx-evil: 1", aliases: [], fallbacks: [], routing: "" }] }),
    ).rejects.toThrow("models[0].name: must be letters, digits and . _ : / -");
    const v1 = await edge.sync.putCatalog({
      models: [{ name: "a", aliases: [], fallbacks: [], routing: "" }],
      version: 10n,
    });
    expect(v1.version).toBe(10n);
    await expect(edge.sync.putCatalog({ models: [], version: 5n })).rejects.toThrow(/not newer/);
    expect((await edge.sync.putCatalog({ models: [] })).version).toBe(11n);
    await edge.sync.pushLoad({ loads: [{ endpointId: "hand-1", waiting: 1, running: 2, kvUsage: 0.5 }] });
  });
});
