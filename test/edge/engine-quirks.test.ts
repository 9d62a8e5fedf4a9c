import { connect, createServer, type Server, type Socket } from "node:net";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/process.ts";
import {
  chatBody,
  clientFor,
  createKey,
  type Edge,
  type EndpointSpec,
  keyUsage,
  setEndpoints,
  startEdge,
  startSim,
  stopStarted,
} from "./helpers.ts";

/**
 * The edge in workerd in front of OpenAI-compatible engines that are not
 * vLLM: the sim engine with each of its --sim-quirks (docs/sim-engine.md),
 * driven by the openai client. Per quirk: clean streams raise nothing,
 * carry usage exactly as asked, and never trip the breaker; a stream cut by
 * the engine dying after its first token raises an APIError and is charged
 * more than nothing. Then eight clients stream for 30 s against an engine
 * with every quirk at once, and none is refused. The engines know their
 * model by a name of their own, which the endpoints' served_model_name
 * gives (router-only with engines run by hand).
 */
const QUIRK_SETS: Record<string, string[]> = {
  "no-done": ["no-done"],
  "usage-on-finish": ["usage-on-finish"],
  "no-continuous-usage": ["no-continuous-usage"],
  "fastapi-errors": ["fastapi-errors"],
  "pinned-model": ["pinned-model"],
  // The server issue 23 met: all of these at once.
  all: ["no-done", "usage-on-finish", "no-continuous-usage", "fastapi-errors", "pinned-model"],
};
const THRESHOLD = 3;
/** Requests per client in the load test: a count, not a duration, so every run does the same work. */
const LOAD_REQUESTS = 40;

const model = (name: string, cut = false) => `${cut ? "qcut" : "q"}-${name}`;

/**
 * A link to an engine that closes kept-alive connections the way vLLM's
 * uvicorn does after 5 s idle, at the worst moment: as the next request
 * goes out on one. From the edge's side that request is written and the
 * connection closes unanswered. `reused` does that to every request that
 * comes on a connection already answered once; `all` to every request,
 * a link to an engine that is gone.
 */
interface ClosingLink {
  url: string;
  /** Connections the edge opened. */
  opened: number;
  /** Requests closed unanswered. */
  dropped: number;
  server: Server;
}

async function closingLink(engine: { port: number }, drop: "reused" | "all"): Promise<ClosingLink> {
  const link = { url: "", opened: 0, dropped: 0 } as ClosingLink;
  link.server = createServer((edgeSide: Socket) => {
    link.opened++;
    let answered = false;
    const engineSide = connect(engine.port, "127.0.0.1");
    const close = () => {
      edgeSide.destroy();
      engineSide.destroy();
    };
    edgeSide.on("data", (bytes: Buffer) => {
      if (drop === "all" || answered) {
        link.dropped++;
        close();
      } else engineSide.write(bytes);
    });
    engineSide.on("data", (bytes: Buffer) => {
      answered = true;
      edgeSide.write(bytes);
    });
    edgeSide.on("error", close).on("close", close);
    engineSide.on("error", close).on("close", close);
  });
  await new Promise<void>((resolve) => link.server.listen(0, "127.0.0.1", resolve));
  const address = link.server.address();
  link.url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
  return link;
}

describe("edge in front of engines with other servers' quirks", () => {
  let edge: Edge;
  let client: OpenAI;
  const links: Record<"reused" | "all", ClosingLink | undefined> = { reused: undefined, all: undefined };

  beforeAll(async () => {
    const edgeUp = startEdge({ failure_threshold: THRESHOLD, cooldown: "30s" });
    // One at a time: a dozen engines starting at once on a busy machine
    // each take far longer than the same started in turn.
    const endpoints: EndpointSpec[] = [];
    for (const name of Object.keys(QUIRK_SETS)) {
      // A pinned engine answers to its own name whatever it is asked for.
      const flags = ["--sim-quirks", ...QUIRK_SETS[name]!, "--served-model-name", `engine-${name}`];
      // The catalog's names are not the engines': an engine that answers to
      // its own name only is sent that name (served_model_name), a pinned one
      // takes whatever it is sent.
      const served = QUIRK_SETS[name]!.includes("pinned-model") ? {} : { servedModelName: `engine-${name}` };
      const sim = await startSim(`q-${name}`, [...flags, "--sim-speed", "50"]);
      const cut = await startSim(`qcut-${name}`, [...flags, "--sim-crash-after", "0", "--sim-speed", "5"]);
      endpoints.push(
        { id: `q-${name}`, url: sim.url, models: [model(name)], ...served },
        { id: `qcut-${name}`, url: cut.url, models: [model(name, true)], ...served },
      );
    }
    const idle = await startSim("idle", ["--sim-speed", "50"]);
    for (const drop of ["reused", "all"] as const) {
      const link = await closingLink(idle, drop);
      links[drop] = link;
      endpoints.push({
        id: `idle-${drop}`,
        url: link.url,
        models: [`idle-${drop}`],
        servedModelName: "idle",
      });
    }
    edge = await edgeUp;
    await setEndpoints(edge, endpoints);
    client = clientFor(edge, (await createKey(edge)).secret);
  }, 120_000);

  afterAll(async () => {
    for (const link of Object.values(links)) link?.server.close();
    await stopStarted();
  });

  describe.each(Object.keys(QUIRK_SETS))("quirks: %s", (name) => {
    it("streams cleanly, with usage exactly as asked, and the breaker stays closed", async () => {
      for (let i = 0; i < THRESHOLD + 2; i++) {
        const withUsage = i % 2 === 0;
        const stream = await client.chat.completions.create({
          model: model(name),
          messages: [{ role: "user", content: `Tell me something, ${i}.` }],
          max_tokens: 12,
          stream: true,
          ...(withUsage ? { stream_options: { include_usage: true } } : {}),
        });
        let text = "";
        let finish: string | null = null;
        const usages: OpenAI.CompletionUsage[] = [];
        for await (const chunk of stream) {
          if (chunk.usage) usages.push(chunk.usage);
          for (const c of chunk.choices) {
            text += c.delta.content ?? "";
            finish = c.finish_reason ?? finish;
          }
        }
        expect(text.length).toBeGreaterThan(0);
        expect(finish).not.toBeNull();
        if (withUsage) {
          expect(usages).toHaveLength(1);
          expect(usages[0]!.completion_tokens).toBe(12);
          expect(usages[0]!.prompt_tokens).toBeGreaterThan(0);
        } else expect(usages).toEqual([]);
      }
      const { pools } = await edge.sync.getPoolStatus({ model: model(name) });
      expect(pools[0]!.endpoints.map((e) => [e.id, e.breaker, e.breakerReason])).toEqual([
        [`q-${name}`, "closed", ""],
      ]);
    });

    it("answers a non-streamed request, and an engine's error in OpenAI's shape with its status", async () => {
      const done = await client.chat.completions.create({
        model: model(name),
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 5,
      });
      expect(done.usage?.completion_tokens).toBe(5);
      // The sim refuses a prompt longer than its context: a 400 from the engine itself.
      const err = await client.chat.completions
        .create({ model: model(name), messages: [{ role: "user", content: "hi" }], max_tokens: 10_000_000 })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      const e = err as InstanceType<typeof OpenAI.BadRequestError>;
      expect(e.status).toBe(400);
      expect(e.message).not.toContain("{");
      expect(e.message).toMatch(/max_tokens|context|length/i);
    });

    it("raises an APIError for a stream cut by the engine dying, and charges it more than nothing", async () => {
      const key = await createKey(edge);
      const own = clientFor(edge, key.secret);
      const stream = await own.chat.completions.create({
        model: model(name, true),
        messages: [{ role: "user", content: "Tell me a long story." }],
        max_tokens: 200,
        stream: true,
      });
      let chunks = 0;
      const err = await (async () => {
        for await (const c of stream) chunks += c.choices.length;
      })().catch((e: unknown) => e);
      expect(chunks).toBeGreaterThanOrEqual(1);
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const usage = await waitUntil(
        "the cut stream's charge",
        async () => {
          const u = await keyUsage(edge, key.id).catch(() => undefined);
          return u && u.requests === 1 ? u : undefined;
        },
        10_000,
      );
      expect(usage.partial).toBe(1);
      expect(usage.prompt).toBeGreaterThan(0);
      expect(usage.completion).toBeGreaterThan(0);
    });
  });

  it(`serves eight streaming clients ${LOAD_REQUESTS} requests each from an engine with every quirk, refusing none`, async () => {
    const failures: string[] = [];
    let served = 0;
    await Promise.all(
      Array.from({ length: 8 }, async (_, w) => {
        for (let i = 0; i < LOAD_REQUESTS; i++) {
          try {
            const stream = await client.chat.completions.create({
              model: model("all"),
              messages: [{ role: "user", content: `Client ${w} says hello.` }],
              max_tokens: 16,
              stream: true,
              stream_options: { include_usage: true },
            });
            let usage = 0;
            for await (const c of stream) if (c.usage) usage++;
            if (usage !== 1) failures.push(`${usage} usage chunks`);
            served++;
          } catch (e) {
            failures.push(String(e));
          }
        }
      }),
    );
    expect(failures).toEqual([]);
    expect(served).toBe(8 * LOAD_REQUESTS);
    const { pools } = await edge.sync.getPoolStatus({ model: model("all") });
    expect(pools[0]!.endpoints[0]!.breaker).toBe("closed");
  }, 90_000);

  it("ends the stream of an engine that sends no [DONE] with one, and no error", async () => {
    const r = await fetch(`${edge.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${(await createKey(edge)).secret}`,
        "content-type": "application/json",
      },
      body: JSON.stringify(chatBody(model("no-done"), { stream: true })),
    });
    const text = await r.text();
    expect(text.trim().endsWith("data: [DONE]")).toBe(true);
    expect(text).not.toContain('"error"');
  });

  describe("an engine that closes a kept-alive connection as a request goes out on it", () => {
    it("sends that request once more on a new connection: served, on the same attempt, the breaker told nothing", async () => {
      const link = links.reused!;
      const ask = (i: number) => ({
        model: "idle-reused",
        messages: [{ role: "user" as const, content: `Request ${i}.` }],
        max_tokens: 4,
      });
      for (let i = 0; i < 3; i++) {
        const whole = await client.chat.completions.create(ask(i)).withResponse();
        expect(whole.data.usage?.completion_tokens).toBe(4);
        expect(whole.response.headers.get("x-llmgw-attempts")).toBe("1");
        const streamed = await client.chat.completions.create({ ...ask(i), stream: true }).withResponse();
        let finish: string | null = null;
        for await (const c of streamed.data) finish = c.choices[0]?.finish_reason ?? finish;
        expect(finish).toBe("length");
        expect(streamed.response.headers.get("x-llmgw-attempts")).toBe("1");
      }
      // The runtime kept its connection, and the link closed it under a request.
      expect(link.dropped).toBeGreaterThan(0);
      const { pools } = await edge.sync.getPoolStatus({ model: "idle-reused" });
      expect(pools[0]!.endpoints.map((e) => [e.breaker, e.breakerReason])).toEqual([["closed", ""]]);
    });

    it("sends it once more only: an engine that is gone still fails, and its breaker opens", async () => {
      const link = links.all!;
      for (let i = 0; i < THRESHOLD; i++) {
        const opened = link.opened;
        const err = await client.chat.completions
          .create({ model: "idle-all", messages: [{ role: "user", content: "hi" }], max_tokens: 4 })
          .catch((e: unknown) => e);
        expect(err).toBeInstanceOf(OpenAI.APIError);
        expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe("upstream_unreachable");
        expect(link.opened - opened, "connections for one request").toBe(2);
      }
      const { pools } = await edge.sync.getPoolStatus({ model: "idle-all" });
      expect(pools[0]!.endpoints[0]!.breaker).toBe("open");
      expect(pools[0]!.endpoints[0]!.breakerReason).toMatch(/^upstream_unreachable/);
    });
  });
});
