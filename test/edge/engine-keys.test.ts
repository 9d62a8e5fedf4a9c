import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, type MessageInitShape, toJsonString } from "@bufbuild/protobuf";
import type { ConnectError } from "@connectrpc/connect";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EdgeSyncService, type EndpointSchema } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { runLlmgw } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type FastEdge,
  type Sim,
  startEdgeMiniflare,
  startSglangSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * Engines that require a key (`--api-key`): the sim engine's SGLang persona
 * refuses every request without `Authorization: Bearer KEY` with a 401, as
 * SGLang does. The edge in workerd sends each endpoint's key, found by its
 * id in the union of the sites' sets (a site's endpoint under `id@site`).
 * An engine that refuses the edge's key is that endpoint's failure: retried
 * on the next endpoint, counted by its breaker, and with nothing left the
 * client gets a 502 `upstream_unauthorized`, never a 401 that would say its
 * own key is wrong. `llmgw ctl endpoints set` reads a static endpoint's key
 * from the variable its `api_key_env` names. No key the edge holds ever
 * comes back out of it: not in an EdgeSync answer, /v1/models, an error,
 * the access log or the Worker's log.
 */
const KEY_A = "llmgw-test-key-a-4f1d7c9e2b";
const KEY_B = "llmgw-test-key-b-83a6e05d1c";
const WRONG = "llmgw-test-wrong-5e2c9a7f30";
const SECRETS = [KEY_A, KEY_B, WRONG];
const THRESHOLD = 3;

/** An endpoint as the control plane would push it, with the engine's key. */
const endpoint = (
  id: string,
  url: string,
  model: string,
  apiKey: string,
): MessageInitShape<typeof EndpointSchema> => ({
  id,
  url,
  models: [model],
  pool: "default",
  weight: 1,
  priority: 0,
  via: "direct",
  apiKey,
});

const ask = (model: string) => ({
  model,
  messages: [{ role: "user" as const, content: "Say something." }],
  max_tokens: 8,
});

describe("engines that require a key", () => {
  let edge: FastEdge;
  let simA: Sim;
  let simB: Sim;
  let key: TestKey;
  let client: OpenAI;
  /** Everything the edge answered that a key could hide in, for the last test. */
  const answers: string[] = [];

  beforeAll(async () => {
    [edge, simA, simB] = await Promise.all([
      startEdgeMiniflare({ failure_threshold: THRESHOLD, cooldown: "10m", retries: 2 }),
      startSglangSim("ek-a", ["--api-key", KEY_A]),
      startSglangSim("ek-b", ["--api-key", KEY_B]),
    ]);
    // Round-robin: the endpoint with the wrong key is leased first every other request.
    await edge.sync.putCatalog({ models: [{ name: "ek-mixed", routing: "round-robin" }] });
    const set = await edge.sync.putEndpointSets({
      endpoints: [
        endpoint("ek-ok", simA.url, "ek-ok", KEY_A),
        endpoint("ek-mixed-bad", simA.url, "ek-mixed", WRONG),
        endpoint("ek-mixed-good", simA.url, "ek-mixed", KEY_A),
        endpoint("ek-wrong", simA.url, "ek-wrong", WRONG),
        // The same id as site eu's below, with another engine's key.
        endpoint("ek-site", simA.url, "ek-site-default", KEY_A),
      ],
    });
    // Site eu's endpoint is `ek-site@eu` in the union: its key is looked up by that id.
    const eu = await edge.sync.putEndpointSets({
      site: "eu",
      endpoints: [endpoint("ek-site", simB.url, "ek-site-eu", KEY_B)],
    });
    const pushed = EdgeSyncService.method.putEndpointSets.output;
    answers.push(toJsonString(pushed, set), toJsonString(pushed, eu));
    key = await createKey(edge);
    client = clientFor(edge, key.secret);
  }, 120_000);

  afterAll(stopStarted);

  it("the engines really require their keys", async () => {
    const post = (url: string, auth?: string) =>
      fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(auth ? { authorization: auth } : {}) },
        body: JSON.stringify(ask("x")),
      });
    expect((await post(simA.url)).status).toBe(401);
    expect((await post(simA.url, `Bearer ${WRONG}`)).status).toBe(401);
    expect((await post(simB.url, `Bearer ${KEY_A}`)).status).toBe(401);
    expect((await post(simA.url, `Bearer ${KEY_A}`)).status).toBe(200);
  });

  it("serves an endpoint pushed with its engine's key, streamed and not", async () => {
    const whole = await client.chat.completions.create(ask("ek-ok")).withResponse();
    expect(whole.response.status).toBe(200);
    expect(whole.response.headers.get("x-llmgw-endpoint")).toBe("ek-ok");
    expect(whole.data.choices[0]!.message.content?.length).toBeGreaterThan(0);

    const stream = await client.chat.completions.create({ ...ask("ek-ok"), stream: true });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    expect(text.length).toBeGreaterThan(0);
  });

  it("sends a site's endpoint its own key, by its qualified id, beside the default site's of the same id", async () => {
    for (const [model, id] of [
      ["ek-site-default", "ek-site"],
      ["ek-site-eu", "ek-site@eu"],
    ] as const) {
      const r = await client.chat.completions.create(ask(model)).withResponse();
      expect(r.response.status, model).toBe(200);
      expect(r.response.headers.get("x-llmgw-endpoint")).toBe(id);
      expect(r.response.headers.get("x-llmgw-attempts")).toBe("1");
      const stream = await client.chat.completions.create({ ...ask(model), stream: true });
      let chunks = 0;
      for await (const _ of stream) chunks++;
      expect(chunks, model).toBeGreaterThan(0);
    }
  });

  it("retries a request the wrong key was refused for on the endpoint with the right one, until that endpoint's breaker opens", async () => {
    const served: { endpoint: string | null; attempts: number }[] = [];
    const deadline = Date.now() + 60_000;
    let bad: { breaker: string; breakerReason: string } | undefined;
    for (;;) {
      const r = await client.chat.completions.create(ask("ek-mixed")).withResponse();
      expect(r.response.status).toBe(200);
      served.push({
        endpoint: r.response.headers.get("x-llmgw-endpoint"),
        attempts: Number(r.response.headers.get("x-llmgw-attempts")),
      });
      const { pools } = await edge.sync.getPoolStatus({ model: "ek-mixed" });
      bad = pools[0]!.endpoints.find((e) => e.id === "ek-mixed-bad");
      if (bad?.breaker === "open") break;
      if (Date.now() > deadline)
        throw new Error(`ek-mixed-bad's breaker still ${bad?.breaker} after ${served.length} requests`);
    }
    expect(served.every((s) => s.endpoint === "ek-mixed-good")).toBe(true);
    // Each request leased to the wrong key first went on to the right one.
    expect(served.filter((s) => s.attempts === 2).length).toBeGreaterThanOrEqual(THRESHOLD);
    expect(bad!.breakerReason).toMatch(
      /^upstream_unauthorized: The engine \(ek-mixed-bad\) refused the edge's key \(HTTP 401\)/,
    );
    const { pools } = await edge.sync.getPoolStatus({ model: "ek-mixed" });
    expect(pools[0]!.endpoints.find((e) => e.id === "ek-mixed-good")!.breaker).toBe("closed");

    // Open, it is passed over: one attempt each, on the right key.
    for (let i = 0; i < 4; i++) {
      const r = await client.chat.completions.create(ask("ek-mixed")).withResponse();
      expect([
        r.response.headers.get("x-llmgw-endpoint"),
        r.response.headers.get("x-llmgw-attempts"),
      ]).toEqual(["ek-mixed-good", "1"]);
    }
  });

  it("with only an endpoint whose key is refused, the client gets a 502 upstream_unauthorized, streamed or not, never a 401", async () => {
    const refusals: InstanceType<typeof OpenAI.APIError>[] = [];
    for (const stream of [false, true]) {
      const err = await client.chat.completions
        .create({ ...ask("ek-wrong"), stream })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect(err).not.toBeInstanceOf(OpenAI.AuthenticationError);
      refusals.push(err as InstanceType<typeof OpenAI.APIError>);
    }
    for (const e of refusals) {
      expect(e.status).toBe(502);
      expect(e.code).toBe("upstream_unauthorized");
      expect(e.type).toBe("server_error");
      expect(e.message).toContain("The engine (ek-wrong) refused the edge's key (HTTP 401)");
      answers.push(e.message, JSON.stringify(e.error));
    }
    // Its breaker heard both: one more opens it, and the model then has no endpoint to offer (503).
    const third = await client.chat.completions.create(ask("ek-wrong")).catch((e: unknown) => e);
    expect((third as InstanceType<typeof OpenAI.APIError>).code).toBe("upstream_unauthorized");
    const { pools } = await edge.sync.getPoolStatus({ model: "ek-wrong" });
    expect(pools[0]!.endpoints[0]!.breaker).toBe("open");
    const after = await client.chat.completions.create(ask("ek-wrong")).catch((e: unknown) => e);
    expect((after as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
    expect((after as InstanceType<typeof OpenAI.APIError>).code).toBe("no_capacity");
  });

  it("refuses a key a header cannot carry without repeating it", async () => {
    const bad = "wrong key-9d41b7";
    const err = (await edge.sync
      .putEndpointSets({ site: "eu", endpoints: [endpoint("ek-site", simB.url, "ek-site-eu", bad)] })
      .catch((e: unknown) => e)) as ConnectError;
    expect(err.rawMessage).toBe(
      "endpoints[0].api_key: must be printable ASCII without spaces (it is sent in a header)",
    );
    expect(err.message).not.toContain("9d41b7");
  });

  it("ctl endpoints set reads a static endpoint's key from the variable api_key_env names, refusing one unset by its path", async () => {
    const file = join(tmpdir(), `engine-keys-${process.pid}.yaml`);
    writeFileSync(
      file,
      [
        `- id: ek-ctl-open`,
        `  url: ${simB.url}`,
        `  models: [ek-ctl-open]`,
        `- id: ek-ctl`,
        `  url: ${simB.url}`,
        `  models: [ek-ctl]`,
        `  api_key_env: LLMGW_TEST_ENGINE_KEY`,
        "",
      ].join("\n"),
    );
    const ctl = (command: string, env: NodeJS.ProcessEnv) =>
      runLlmgw(["ctl", "endpoints", command, file, "--edge", edge.url, "--site", "ctl"], {
        LLMGW_EDGE_TOKEN: edge.token,
        ...env,
      });
    for (const command of ["check", "set"]) {
      const unset = await ctl(command, {});
      expect([unset.code, unset.stderr], command).toEqual([
        1,
        `${file}: invalid endpoints:\n  - endpoints[1].api_key_env: LLMGW_TEST_ENGINE_KEY is not set\n`,
      ]);
    }
    const spaced = await ctl("set", { LLMGW_TEST_ENGINE_KEY: "two words-73c1" });
    expect(spaced.code).toBe(1);
    expect(spaced.stderr).toContain(
      "endpoints[1].api_key_env: LLMGW_TEST_ENGINE_KEY: must be printable ASCII without spaces",
    );
    expect(spaced.stderr).not.toContain("73c1");

    const set = await ctl("set", { LLMGW_TEST_ENGINE_KEY: KEY_B });
    expect(set.stderr).toBe("");
    expect(set.stdout).toMatch(/wrote 2 endpoints .* site ctl/);
    const r = await client.chat.completions.create(ask("ek-ctl")).withResponse();
    expect(r.response.headers.get("x-llmgw-endpoint")).toBe("ek-ctl@ctl");
    // Its neighbour has no api_key_env: sent without a key, which this engine refuses.
    const open = await client.chat.completions.create(ask("ek-ctl-open")).catch((e: unknown) => e);
    expect((open as InstanceType<typeof OpenAI.APIError>).code).toBe("upstream_unauthorized");
    answers.push((open as Error).message);
  });

  it("gives no key back: in no EdgeSync answer, /v1/models, error, access line or log line", async () => {
    await edge.sync.pushLoad({
      loads: ["ek-ok", "ek-mixed-bad", "ek-mixed-good"].map((endpointId) => ({
        endpointId,
        waiting: 1,
        running: 2,
        kvUsage: 0.25,
        state: "ready",
      })),
    });
    const models = await fetch(`${edge.url}/v1/models`, {
      headers: { authorization: `Bearer ${key.secret}` },
    });
    expect(models.status).toBe(200);
    answers.push(await models.text());
    const sync = edge.sync as unknown as Record<string, (req: unknown) => Promise<never>>;
    /** Each call's answer as JSON, or its error's message. */
    const call = async (method: (typeof EdgeSyncService.methods)[number], req: Record<string, unknown>) => {
      try {
        answers.push(toJsonString(method.output, await sync[method.localName]!(create(method.input, req))));
      } catch (err) {
        answers.push((err as Error).message);
      }
    };
    // The calls with answers worth reading first, then every call the service has with
    // an empty request, so a call added later is looked at too. (An empty catalog and
    // router section are stored by the last: nothing after this test needs them.)
    const by = EdgeSyncService.method;
    await call(by.getPoolStatus, {});
    for (const model of ["ek-ok", "ek-mixed", "ek-wrong", "ek-site-default", "ek-site-eu"])
      await call(by.getPoolStatus, { model });
    await call(by.getUsage, { keyId: key.id });
    await call(by.listKeys, {});
    await call(by.getRouterSettings, {});
    for (const method of EdgeSyncService.methods) await call(method, {});
    expect(answers.join("\n")).toContain("ek-mixed-bad");
    expect(answers.join("\n")).toContain("upstream_unauthorized");
    const logged = [...answers, ...edge.logged, ...edge.access.map((a) => JSON.stringify(a))].join("\n");
    for (const secret of SECRETS) expect(logged).not.toContain(secret);
    expect(edge.access.some((a) => a.error_code === "upstream_unauthorized")).toBe(true);
  });
});
