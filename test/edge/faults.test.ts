import { createServer, type Server, type Socket } from "node:net";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, waitUntil } from "../harness/process.ts";
import {
  chatBody,
  clientFor,
  createKey,
  type Edge,
  type Sim,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * Engines that fail on purpose (sim engine fault flags) behind the real
 * edge: refused connections, a crash after the first token, hangs before
 * the first token (committed at the engine's headers, and at the first
 * token) and mid-stream, an engine that accepts the connection and
 * never answers, a frozen (SIGSTOP) engine, and the breaker's
 * open/half-open/closed cycle. Timeouts are shortened through LLMGW_ROUTER,
 * all but response_header, which keeps its default: the first token is due
 * within first_token of the attempt's start, headers or not.
 */
const RESPONSE_HEADER_MS = 60_000;
const FIRST_TOKEN_MS = 1500;
const IDLE_MS = 1000;
const COOLDOWN_MS = 2000;

describe("edge under engine faults", () => {
  let edge: Edge;
  let good: Sim;
  let crash: Sim;
  let hangFirst: Sim;
  let hangMid: Sim;
  let frozen: Sim;
  let deadPort: number;
  let breakerPort: number;
  // Accepts connections and never writes a byte: no response headers.
  let silent: Server;
  const held: Socket[] = [];
  let key: TestKey;
  let client: OpenAI;
  // The same faults behind an edge that commits streams at their first token.
  let heldEdge: Edge;
  let heldClient: OpenAI;

  beforeAll(async () => {
    [deadPort, breakerPort] = await Promise.all([freePort(), freePort()]);
    silent = createServer((socket) => held.push(socket));
    await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
    const silentPort = (silent.address() as { port: number }).port;
    let crash2: Sim;
    let moveOn: Sim;
    const router = {
      retries: 2,
      failure_threshold: 3,
      cooldown: `${COOLDOWN_MS}ms`,
      timeouts: {
        response_header: `${RESPONSE_HEADER_MS}ms`,
        first_token: `${FIRST_TOKEN_MS}ms`,
        idle: `${IDLE_MS}ms`,
      },
    };
    [edge, heldEdge, good, crash, crash2, hangFirst, hangMid, frozen, moveOn] = await Promise.all([
      startEdge(router),
      startEdge({ ...router, stream_commit: "first_token" }),
      startSim("good", ["--served-model-name", "good", "retry", "moveon"]),
      startSim("crash", ["--sim-crash-after", "0", "--sim-speed", "20"]),
      startSim("crash2", ["--sim-crash-after", "0", "--sim-speed", "20"]),
      startSim("hangfirst", ["--sim-hang-after", "0", "--sim-hang-phase", "first-token"]),
      startSim("hangmid", ["--sim-hang-after", "0", "--sim-hang-phase", "mid-stream"]),
      startSim("frozen"),
      startSim("moveon", ["--sim-hang-after", "0", "--sim-hang-phase", "first-token"]),
    ]);
    // Headers and then nothing from the first, an answer from the second.
    const moveOnEndpoints = [
      { id: "moveon-hang-1", url: moveOn.url, models: ["moveon"], priority: 0 },
      { id: "good-1", url: good.url, models: ["moveon"], priority: 1 },
    ];
    await setEndpoints(edge, [
      // priority 0 is tried first, so the dead endpoint is always attempt 1.
      { id: "dead", url: `http://127.0.0.1:${deadPort}`, models: ["retry"], priority: 0 },
      { id: "good-1", url: good.url, models: ["retry", "good", "moveon"], priority: 1 },
      moveOnEndpoints[0]!,
      { id: "crash-1", url: crash.url, models: ["crash"] },
      { id: "crash2-1", url: crash2.url, models: ["crash2"] },
      { id: "hangfirst-1", url: hangFirst.url, models: ["hangfirst"] },
      { id: "hangmid-1", url: hangMid.url, models: ["hangmid"] },
      { id: "breaker-1", url: `http://127.0.0.1:${breakerPort}`, models: ["brk"] },
      { id: "silent-1", url: `http://127.0.0.1:${silentPort}`, models: ["silent"] },
      { id: "frozen-1", url: frozen.url, models: ["frozen"] },
    ]);
    key = await createKey(edge);
    client = clientFor(edge, key.secret);
    await setEndpoints(heldEdge, [
      { id: "hangfirst-1", url: hangFirst.url, models: ["hangfirst"] },
      ...moveOnEndpoints,
    ]);
    heldClient = clientFor(heldEdge, (await createKey(heldEdge)).secret);
  }, 90_000);

  afterAll(async () => {
    frozen?.proc.child.kill("SIGCONT");
    for (const socket of held) socket.destroy();
    silent?.close();
    await stopStarted();
  });

  const post = (body: unknown) =>
    fetch(`${edge.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key.secret}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });

  it("retries a refused connection on another endpoint before anything is sent", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "retry", messages: [{ role: "user", content: "hi" }], max_tokens: 3 })
      .withResponse();
    expect(data.usage!.completion_tokens).toBe(3);
    expect(response.headers.get("x-llmgw-attempts")).toBe("2");
    expect(response.headers.get("x-llmgw-endpoint")).toBe("good-1");
    const stream = await client.chat.completions
      .create({ model: "retry", messages: [{ role: "user", content: "hi" }], max_tokens: 3, stream: true })
      .withResponse();
    expect(stream.response.headers.get("x-llmgw-attempts")).toBe("2");
    let n = 0;
    for await (const c of stream.data) n += c.choices.length;
    expect(n).toBeGreaterThan(0);
  });

  it("moves a stream whose engine sent headers and no token to the next endpoint, inside the 200 it has", async () => {
    const ask = (via: OpenAI) =>
      via.chat.completions
        .create({ model: "moveon", messages: [{ role: "user", content: "hi" }], max_tokens: 3, stream: true })
        .withResponse();
    const chunks = async (data: AsyncIterable<{ choices: unknown[] }>) => {
      let n = 0;
      for await (const c of data) n += c.choices.length;
      return n;
    };
    // Committed at the headers: they name the engine that sent them; the answer is another's.
    const committed = await ask(client);
    expect(committed.response.headers.get("x-llmgw-endpoint")).toBe("moveon-hang-1");
    expect(committed.response.headers.get("x-llmgw-attempts")).toBe("1");
    expect(await chunks(committed.data)).toBeGreaterThan(0);
    // Committed at the first token: the headers come from the engine that answered.
    const held = await ask(heldClient);
    expect(held.response.headers.get("x-llmgw-endpoint")).toBe("good-1");
    expect(held.response.headers.get("x-llmgw-attempts")).toBe("2");
    expect(await chunks(held.data)).toBeGreaterThan(0);
  });

  it("turns a crash after the first token into an SSE error event and a closed stream", async () => {
    const res = await post(chatBody("crash", { stream: true, max_tokens: 200 }));
    expect(res.status).toBe(200);
    const text = await res.text(); // resolves only because the edge closes the stream
    const events = text.split("\n\n").filter(Boolean);
    const last = JSON.parse(events.at(-1)!.slice("data: ".length));
    expect(last.error).toMatchObject({ type: "server_error", code: "upstream_disconnected" });
    expect(Object.keys(last.error).sort()).toEqual(["code", "message", "param", "type"]);
    expect(text).not.toContain("[DONE]");
    expect(events.length).toBeGreaterThanOrEqual(2);
  });

  it("surfaces that error event through the openai client as an APIError mid-iteration", async () => {
    const stream = await client.chat.completions.create({
      model: "crash2",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 200,
      stream: true,
    });
    let chunks = 0;
    const err = await (async () => {
      for await (const c of stream) chunks += c.choices.length;
    })().catch((e) => e);
    expect(chunks).toBeGreaterThanOrEqual(1);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String(err.message)).toMatch(/closed the stream|failed mid-stream/);
  });

  /** A streamed request that fails before its first token: the error the client got, and how long it took. */
  const failedStream = async (model: string, via: OpenAI = client) => {
    const t0 = Date.now();
    const err = await via.chat.completions
      .create({ model, messages: [{ role: "user", content: "hi" }], stream: true })
      .catch((e) => e);
    return { err, took: Date.now() - t0 };
  };

  it("ends a stream whose engine sends headers and no token within first_token with first_token_timeout", async () => {
    // Committed at the engine's headers (the default): the client has its 200, then the error event.
    const t0 = Date.now();
    const stream = await client.chat.completions.create({
      model: "hangfirst",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
    });
    let chunks = 0;
    const err = await (async () => {
      for await (const c of stream) chunks += c.choices.length;
    })().catch((e) => e);
    const took = Date.now() - t0;
    expect(chunks).toBe(0);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe("first_token_timeout");
    expect(err.message).toMatch(/hangfirst-1.*within 1500 ms/);
    expect(took).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
  });

  it("answers that with a 504 of its own when streams are committed at the first token", async () => {
    const { err, took } = await failedStream("hangfirst", heldClient);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(504);
    expect(err.code).toBe("first_token_timeout");
    expect(took).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
  });

  it("answers 504 within first_token when an engine accepts the connection but sends no headers", async () => {
    const { err, took } = await failedStream("silent");
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(504);
    expect(err.code).toBe("first_token_timeout");
    expect(err.message).toMatch(/silent-1.*within 1500 ms/);
    expect(took).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
  });

  it("leaves a frozen (SIGSTOP) engine within first_token, not after response_header", async () => {
    // Answers first, so the edge has a connection to it; then freeze it.
    const warm = await client.chat.completions.create({
      model: "frozen",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
    });
    expect(warm.choices).toHaveLength(1);
    frozen.proc.child.kill("SIGSTOP");
    try {
      const { err, took } = await failedStream("frozen");
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect(err.status).toBe(504);
      expect(err.code).toBe("first_token_timeout");
      expect(err.message).toMatch(/frozen-1/);
      expect(took).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50);
    } finally {
      frozen.proc.child.kill("SIGCONT");
    }
  });

  it("ends a stream that stalls mid-way with an error event after idle", async () => {
    const stream = await client.chat.completions.create({
      model: "hangmid",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 100,
      stream: true,
    });
    let got = 0;
    const t0 = Date.now();
    const err = await (async () => {
      for await (const c of stream) got += c.choices.length;
    })().catch((e) => e);
    expect(got).toBeGreaterThanOrEqual(1);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String(err.message)).toMatch(/idle/);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(IDLE_MS - 100);
  });

  it("opens the breaker after failure_threshold failures and closes it after cooldown", async () => {
    const attempts: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await post(chatBody("brk"));
      expect(r.status).toBe(503);
      expect((await r.json()).error.code).toBe("upstream_unreachable");
      attempts.push(r.headers.get("x-llmgw-attempts")!);
    }
    expect(attempts).toEqual(["1", "1", "1"]);
    // Open: the endpoint is not even tried.
    const open = await post(chatBody("brk"));
    expect(open.status).toBe(503);
    expect(open.headers.get("x-llmgw-attempts")).toBe("0");
    expect((await open.json()).error.code).toBe("no_capacity");
    // Bring the engine up; after the cooldown one probe goes through and closes it.
    await startSim("brk", [], breakerPort); // stopped with the rest in afterAll
    // Open until the cooldown ends, engine up or not: each request meanwhile
    // is refused untried, and the first one after it is the probe. (Whether
    // a request lands between the engine's start and the cooldown's end
    // depends on how fast the engine starts, so none is asserted there.)
    const probe = await waitUntil(
      "the breaker's cooldown to end",
      async () => {
        const r = await post(chatBody("brk"));
        if (r.headers.get("x-llmgw-attempts") !== "0") return r;
        await r.body?.cancel();
        return undefined;
      },
      COOLDOWN_MS + 10_000,
      50,
    );
    expect(probe.status).toBe(200);
    expect(probe.headers.get("x-llmgw-attempts")).toBe("1");
    const closed = await Promise.all([post(chatBody("brk")), post(chatBody("brk"))]);
    expect(closed.map((r) => r.status)).toEqual([200, 200]);
  });
});
