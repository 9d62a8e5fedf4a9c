import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium } from "../harness/browser.ts";
import {
  chatBody,
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
 * A web page calling the edge from another origin, as a browser does: the
 * preflight, then the request with an `Origin` header, against the edge in
 * workerd and a real sim engine. `router.cors` pushed through EdgeSync as
 * the control plane pushes it.
 */
const PAGE = "https://chat.example.com";

describe("cross-origin requests", () => {
  let edge: Edge;
  let sim: Sim;
  let key: TestKey;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([startEdge({}, "edge-cors"), startSim("corsy")]);
    await setEndpoints(edge, [{ id: "corsy-1", url: sim.url, models: ["corsy"] }]);
    key = await createKey(edge);
  }, 90_000);
  afterAll(() => stopStarted());

  const preflight = (origin: string, path = "/v1/chat/completions") =>
    fetch(`${edge.url}${path}`, {
      method: "OPTIONS",
      headers: {
        origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
      },
    });
  const chat = (headers: Record<string, string>, body: Record<string, unknown> = chatBody("corsy")) =>
    fetch(`${edge.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key.secret}`, ...headers },
      body: JSON.stringify(body),
    });
  const pushCors = (allowed: string[]) =>
    edge.sync.putRouterSettings({ settingsJson: JSON.stringify({ cors: { allowed_origins: allowed } }) });

  it("answers any origin by default: the preflight echoes the headers asked for", async () => {
    const res = await preflight(PAGE);
    expect(res.status).toBe(204);
    expect(res.headers.get("access-control-allow-origin")).toBe("*");
    expect(res.headers.get("access-control-allow-methods")).toBe("GET, POST");
    // A wildcard would not cover Authorization; the openai package adds x-stainless-* of its own.
    expect(res.headers.get("access-control-allow-headers")).toBe(
      "authorization, content-type, x-stainless-os",
    );
    expect(res.headers.get("access-control-allow-credentials")).toBeNull();
    expect(Number(res.headers.get("access-control-max-age"))).toBeGreaterThan(0);
  });

  it("lets the page read a streamed answer, its request id and an error's body", async () => {
    const res = await chat({ origin: PAGE }, chatBody("corsy", { stream: true }));
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBe("*");
    const exposed = res.headers.get("access-control-expose-headers")?.split(", ") ?? [];
    expect(exposed).toEqual(
      expect.arrayContaining([
        "x-request-id",
        "retry-after",
        "retry-after-ms",
        "x-llmgw-band",
        "x-ratelimit-remaining-tokens",
      ]),
    );
    expect(await res.text()).toContain("data: [DONE]");

    for (const r of [
      await chat({ origin: PAGE, authorization: "Bearer sk-llmgw-wrong" }),
      await chat({ origin: PAGE }, { model: "no-such-model", messages: [] }),
      await fetch(`${edge.url}/v1/nowhere`, { headers: { origin: PAGE } }),
    ]) {
      expect([r.status, r.headers.get("access-control-allow-origin")]).toEqual([r.status, "*"]);
      expect(r.status).toBeGreaterThanOrEqual(400);
      expect(((await r.json()) as { error: { message: string } }).error.message).toBeTruthy();
    }
  });

  it("adds nothing for a request without an Origin, nor to EdgeSync", async () => {
    const res = await chat({});
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
    await res.text();
    const sync = await preflight(PAGE, "/edge.v1.EdgeSyncService/GetUsage");
    expect(sync.headers.get("access-control-allow-origin")).toBeNull();
  });

  it("answers only the origins listed, naming the one it allows, and none with []", async () => {
    await pushCors([PAGE]);
    try {
      const allowed = await chat({ origin: PAGE });
      expect(allowed.headers.get("access-control-allow-origin")).toBe(PAGE);
      expect(allowed.headers.get("vary")).toContain("Origin");
      await allowed.text();
      expect((await preflight(PAGE)).headers.get("access-control-allow-origin")).toBe(PAGE);

      const other = await chat({ origin: "https://elsewhere.example" });
      expect(other.status).toBe(200); // not a browser: the answer is served, a browser would not show it
      expect(other.headers.get("access-control-allow-origin")).toBeNull();
      await other.text();
      const refused = await preflight("https://elsewhere.example");
      expect([refused.status, refused.headers.get("access-control-allow-origin")]).toEqual([405, null]);

      await pushCors([]);
      const off = await preflight(PAGE);
      expect([off.status, off.headers.get("access-control-allow-origin")]).toEqual([405, null]);
    } finally {
      await pushCors(["*"]);
    }
  });

  it("refuses a pushed origin that is not one, naming the path", async () => {
    const err = await pushCors(["https://chat.example.com/"]).catch((e: unknown) => e);
    expect(String(err)).toMatch(/cors\.allowed_origins\[0\]: must be "\*" or an origin/);
  });
});

/**
 * What a page served from one origin can do with the edge on another, in
 * headless Chromium: the browser, not a header check, decides. The request
 * carries what the openai package sends from a browser (a bearer key, JSON,
 * its own x-stainless-* header), so it is preflighted.
 */
describe("a web page on another origin, in a browser", () => {
  let edge: Edge;
  let sim: Sim;
  let key: TestKey;
  let site: Server;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    site = createServer((_req, res) =>
      res.writeHead(200, { "content-type": "text/html" }).end("<!doctype html><title>chat</title>"),
    );
    await new Promise<void>((r) => site.listen(0, "127.0.0.1", r));
    [edge, sim, browser] = await Promise.all([
      startEdge({}, "edge-cors-browser"),
      startSim("pagey"),
      launchChromium(),
    ]);
    await setEndpoints(edge, [{ id: "pagey-1", url: sim.url, models: ["pagey"] }]);
    key = await createKey(edge);
    page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${(site.address() as AddressInfo).port}/`);
  }, 120_000);
  afterAll(async () => {
    await browser?.close();
    site?.close();
    await stopStarted();
  });

  /** A streamed chat from the page: its text and request id, or the error fetch threw. */
  const fromPage = () =>
    page.evaluate(
      async ({ url, secret }) => {
        try {
          const res = await fetch(`${url}/v1/chat/completions`, {
            method: "POST",
            headers: {
              authorization: `Bearer ${secret}`,
              "content-type": "application/json",
              "x-stainless-os": "Linux",
            },
            body: JSON.stringify({
              model: "pagey",
              messages: [{ role: "user", content: "Hi" }],
              max_tokens: 4,
              stream: true,
            }),
          });
          return { status: res.status, requestId: res.headers.get("x-request-id"), text: await res.text() };
        } catch (err) {
          return { error: String(err) };
        }
      },
      { url: edge.url, secret: key.secret },
    );

  it("streams an answer to a page from any origin by default, and lets it read the request id", async () => {
    const r = await fromPage();
    expect(r).toMatchObject({ status: 200, requestId: expect.stringMatching(/^req_/) });
    expect((r as { text: string }).text).toContain("data: [DONE]");
  });

  it("is refused by the browser once the page's origin is not listed", async () => {
    await edge.sync.putRouterSettings({
      settingsJson: JSON.stringify({ cors: { allowed_origins: ["https://chat.example.com"] } }),
    });
    try {
      expect(await fromPage()).toEqual({ error: expect.stringContaining("Failed to fetch") });
    } finally {
      await edge.sync.putRouterSettings({ settingsJson: "{}" });
    }
  });
});
