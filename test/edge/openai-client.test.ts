import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  clientFor,
  createKey,
  type Edge,
  keyUsage,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/** The official openai client against the edge in workerd, in front of real sim engines. */
describe("edge with the openai client", () => {
  let edge: Edge;
  let simA: Sim;
  let simB: Sim;
  let key: TestKey;
  let bronze: TestKey;
  let client: OpenAI;

  beforeAll(async () => {
    [edge, simA, simB] = await Promise.all([startEdge(), startSim("alpha"), startSim("beta")]);
    await edge.sync.putCatalog({
      models: [
        { name: "alpha", aliases: ["a"], fallbacks: [], routing: "" },
        { name: "gamma", aliases: [], fallbacks: ["alpha"], routing: "" },
      ],
    });
    await setEndpoints(edge, [
      { id: "alpha-1", url: simA.url, models: ["alpha"] },
      { id: "beta-1", url: `${simB.url}/v1`, models: ["beta"] },
    ]);
    key = await createKey(edge, { band: "gold" });
    bronze = await createKey(edge, { band: "bronze", models: ["beta"] });
    client = clientFor(edge, key.secret);
  }, 90_000);

  afterAll(async () => {
    await stopStarted();
  });

  it("serves a non-streamed chat completion with usage and routing headers", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "alpha", messages: [{ role: "user", content: "Hello" }], max_tokens: 6 })
      .withResponse();
    expect(data.object).toBe("chat.completion");
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(data.usage!.completion_tokens).toBe(6);
    expect(response.headers.get("x-llmgw-endpoint")).toBe("alpha-1");
    expect(response.headers.get("x-llmgw-attempts")).toBe("1");
    expect(response.headers.get("x-llmgw-band")).toBe("gold");
    expect(response.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("streams a chat completion; usage is stripped unless asked for", async () => {
    const stream = await client.chat.completions.create({
      model: "alpha",
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 5,
      stream: true,
    });
    let text = "";
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      expect(chunk.usage ?? undefined).toBeUndefined();
      expect(chunk.choices.length).toBe(1);
      text += chunk.choices[0]!.delta.content ?? "";
    }
    expect(chunks).toBeGreaterThanOrEqual(5);
    expect(text.length).toBeGreaterThan(0);
  });

  it("streams with include_usage: one final usage chunk, none on content chunks", async () => {
    const stream = await client.chat.completions.create({
      model: "a", // an alias
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 4,
      stream: true,
      stream_options: { include_usage: true },
    });
    const usages = [];
    for await (const chunk of stream)
      if (chunk.usage) usages.push({ usage: chunk.usage, n: chunk.choices.length });
    expect(usages).toHaveLength(1);
    expect(usages[0]!.n).toBe(0);
    expect(usages[0]!.usage.completion_tokens).toBe(4);
  });

  it("does completions, streamed and not, and keeps unknown fields", async () => {
    const c = await client.completions.create({
      model: "beta",
      prompt: "Once upon a time",
      max_tokens: 5,
      // A vLLM extension: must pass through untouched (the sim accepts it).
      ...({ top_k: 5 } as object),
    });
    expect(c.object).toBe("text_completion");
    expect(c.usage!.completion_tokens).toBe(5);
    const s = await client.completions.create({ model: "beta", prompt: "Once", max_tokens: 3, stream: true });
    let n = 0;
    for await (const chunk of s) n += chunk.choices.length;
    expect(n).toBeGreaterThanOrEqual(3);
  });

  it("lists the models this key may use that can answer, aliases too", async () => {
    await edge.sync.putCatalog({
      models: [
        { name: "alpha", aliases: ["a"], fallbacks: [], routing: "" },
        { name: "gamma", aliases: [], fallbacks: ["alpha"], routing: "" },
        { name: "idle", aliases: ["i"], fallbacks: [], routing: "" },
      ],
    });
    const all: { id: string; root?: string }[] = [];
    for await (const m of client.models.list()) all.push(m as { id: string; root?: string });
    // idle (and its alias) has no endpoint, nor a fallback with one: offering it would only earn a 503.
    expect(all.map((m) => [m.id, m.root])).toEqual([
      ["a", "alpha"],
      ["alpha", "alpha"],
      ["beta", "beta"],
      ["gamma", "gamma"],
    ]);
    const limited = clientFor(edge, bronze.secret);
    const some = [];
    for await (const m of limited.models.list()) some.push(m.id);
    expect(some).toEqual(["beta"]);
  });

  it("retrieves one model as the list has it, and 404s a name the list leaves out", async () => {
    const catalog = (aliases: string[]) => ({
      models: [
        { name: "alpha", aliases, fallbacks: [], routing: "" },
        { name: "gamma", aliases: [], fallbacks: ["alpha"], routing: "" },
        { name: "idle", aliases: ["i"], fallbacks: [], routing: "" },
      ],
    });
    await edge.sync.putCatalog(catalog(["a", "meta/alpha-instruct"]));
    try {
      expect(await client.models.retrieve("a")).toMatchObject({ id: "a", object: "model", root: "alpha" });
      // The client sends the slash as %2F; curl and others send it raw.
      expect(await client.models.retrieve("meta/alpha-instruct")).toMatchObject({ root: "alpha" });
      const raw = await fetch(`${edge.url}/v1/models/meta/alpha-instruct`, {
        headers: { authorization: `Bearer ${key.secret}` },
      });
      expect(await raw.json()).toMatchObject({ id: "meta/alpha-instruct", root: "alpha" });
      // No endpoint (idle), not the key's (alpha for the bronze key), or no such name: all one 404.
      const limited = clientFor(edge, bronze.secret);
      for (const [c, name] of [
        [client, "idle"],
        [limited, "alpha"],
        [client, "nope"],
      ] as const) {
        const err = await c.models.retrieve(name).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(OpenAI.NotFoundError);
        expect((err as InstanceType<typeof OpenAI.NotFoundError>).code).toBe("model_not_found");
        expect((err as Error).message).toContain(`\`${name}\``);
      }
      const unauthenticated = await fetch(`${edge.url}/v1/models/alpha`);
      expect(unauthenticated.status).toBe(401);
      const del = await fetch(`${edge.url}/v1/models/alpha`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${key.secret}` },
      });
      expect([del.status, del.headers.get("allow")]).toEqual([405, "GET"]);
    } finally {
      await edge.sync.putCatalog(catalog(["a"]));
    }
  });

  it("follows a model's fallbacks when it has no endpoint", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "gamma", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 })
      .withResponse();
    expect(data.model).toBe("alpha");
    expect(response.headers.get("x-llmgw-endpoint")).toBe("alpha-1");
  });

  it("maps errors to the SDK's classes with OpenAI-shaped bodies", async () => {
    const bad = clientFor(edge, "sk-not-a-real-key-0000000000");
    const msg = [{ role: "user" as const, content: "x" }];
    await expect(bad.chat.completions.create({ model: "alpha", messages: msg })).rejects.toBeInstanceOf(
      OpenAI.AuthenticationError,
    );
    const limited = clientFor(edge, bronze.secret);
    await expect(limited.chat.completions.create({ model: "alpha", messages: msg })).rejects.toBeInstanceOf(
      OpenAI.PermissionDeniedError,
    );
    const err = await client.chat.completions.create({ model: "nope", messages: msg }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.code).toBe("model_not_found");
    expect(err.param).toBe("model");
    expect(err.type).toBe("invalid_request_error");
    const bad400 = await client.chat.completions
      .create({ model: "alpha", messages: [] as never })
      .catch((e) => e);
    expect(bad400).toBeInstanceOf(OpenAI.BadRequestError);
    expect(bad400.param).toBe("messages");
    const promote = await client.chat.completions
      .create({ model: "alpha", messages: msg }, { headers: { "x-llmgw-band": "platinum" } })
      .catch((e) => e);
    expect(promote).toBeInstanceOf(OpenAI.PermissionDeniedError);
    expect(promote.code).toBe("band_not_allowed");
    const { response } = await client.chat.completions
      .create({ model: "alpha", messages: msg, max_tokens: 1 }, { headers: { "x-llmgw-band": "silver" } })
      .withResponse();
    expect(response.headers.get("x-llmgw-band")).toBe("silver");
  });

  it("normalises engine errors (vLLM's int code) into OpenAI's shape", async () => {
    // The sim refuses max_tokens beyond the context like vLLM: a 400 from the engine.
    const err = await client.chat.completions
      .create({ model: "alpha", messages: [{ role: "user", content: "x" }], max_tokens: 10_000_000 })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(typeof err.code === "string" || err.code === null).toBe(true);
    expect(err.type).toBe("invalid_request_error");
  });

  it("rate-limits by RPM with Retry-After, and revocation takes effect at once", async () => {
    const limited = await createKey(edge, { rpm: 2 });
    const c = clientFor(edge, limited.secret);
    const msg = [{ role: "user" as const, content: "x" }];
    await c.chat.completions.create({ model: "alpha", messages: msg, max_tokens: 1 });
    await c.chat.completions.create({ model: "alpha", messages: msg, max_tokens: 1 });
    const err = await c.chat.completions
      .create({ model: "alpha", messages: msg, max_tokens: 1 })
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(Number(err.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(Number(err.headers.get("retry-after-ms"))).toBeGreaterThan(0);

    const victim = await createKey(edge);
    const v = clientFor(edge, victim.secret);
    await v.chat.completions.create({ model: "alpha", messages: msg, max_tokens: 1 });
    await edge.sync.revokeKey({ id: victim.id });
    await expect(
      v.chat.completions.create({ model: "alpha", messages: msg, max_tokens: 1 }),
    ).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  });

  it("refuses requests once the token budget is spent", async () => {
    const b = await createKey(edge, { budget: { tokens: 10, period: "1d" } });
    const c = clientFor(edge, b.secret);
    const msg = [{ role: "user" as const, content: "Hello there" }];
    await c.chat.completions.create({ model: "alpha", messages: msg, max_tokens: 8 });
    // Charged in waitUntil after the answer: the ledger holds it once the key's usage shows it.
    await waitUntil("the answer charged", async () => {
      const u = await keyUsage(edge, b.id);
      return u.prompt + u.completion >= 10 || undefined;
    });
    const err: unknown = await c.chat.completions
      .create({ model: "alpha", messages: msg, max_tokens: 1 })
      .then(() => undefined)
      .catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect((err as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("insufficient_quota");
    expect((err as Error).message).toContain(
      "You exceeded this key's token budget (10 tokens per 1d); Retry-After says when the next period begins.",
    );
  });
});
