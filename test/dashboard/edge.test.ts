import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clientFor, createKey, type Edge, type TestKey } from "../edge/helpers.ts";
import { launchChromium, screenshot } from "../harness/browser.ts";
import { type ControlPlaneHandle, engineKeyOf } from "../harness/fleet.ts";
import { type LinkedStack, startLinkedStack } from "../harness/linked-stack.ts";
import { waitUntil } from "../harness/process.ts";

/**
 * The dashboard's Edge and Keys panels against the real edge in workerd:
 * the control plane's edge link publishes a sim engine there and polls the
 * pools back; requests go through the edge with the openai client.
 */
const TOKEN = "dashboard-edge-test-admin-token-0123";
const MODEL = "dash-chat";
// Needs two GPUs on a one-GPU node: in the catalog, never placed, so its pool has no endpoint.
const UNPLACED = "dash-unplaced";

describe("the dashboard's Edge and Keys panels, with the edge in workerd", () => {
  let edge: Edge;
  let cp: ControlPlaneHandle;
  let stack: LinkedStack | undefined;
  let browser: Browser;
  let page: Page;
  let key: TestKey;
  // Every request this file sends with the key, each charged once (refusals too): what the edge's count settles at.
  let sent = 0;
  const keyRequests = async () =>
    (await cp.client.getKeyUsage({})).usage.find((u) => u.keyId === key.id)?.requests ?? 0n;

  beforeAll(async () => {
    stack = await startLinkedStack({
      tag: "edge-dashboard",
      adminToken: TOKEN,
      models: `  - name: ${MODEL}
    profiles:
      - name: 1gpu
        engine: vllm
        source: test/dash-chat
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 1 }
        startup_deadline: 60s
  - name: ${UNPLACED}
    profiles:
      - name: tp2
        engine: vllm
        source: test/dash-unplaced
        tensor_parallel: 2
        replicas: { min: 1 }
`,
      node: "dash-edge-1",
      agent: { gpus: "1xH100-80GB" },
      routed: MODEL,
    });
    ({ edge, cp } = stack);
    key = await createKey(edge, { band: "gold" });
    const openai = clientFor(edge, key.secret);
    for (let i = 0; i < 3; i++) {
      await openai.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: `hello ${i}` }],
        max_tokens: 16,
      });
      sent++;
    }
    // Refused at once with 503 no_endpoints; no retries, so each is one request.
    const once = openai.withOptions({ maxRetries: 0 });
    for (let i = 0; i < 2; i++) {
      const err = await once.chat.completions
        .create({ model: UNPLACED, messages: [{ role: "user", content: "hi" }], max_tokens: 4 })
        .catch((e: unknown) => e);
      sent++;
      expect(err).toMatchObject({ status: 503, code: "no_endpoints" });
    }
    browser = await launchChromium();
    page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(`${cp.adminUrl}/#token=${TOKEN}`);
  }, 150_000);

  afterAll(async () => {
    await browser?.close();
    await stack?.stop();
  });

  const onPage = <T>(read: () => Promise<T>, timeout = 15_000) =>
    expect.poll(read, { timeout, interval: 100 });

  it("shows each model's pool as GetEdgeStatus reports it, with the plots", async () => {
    const pool = page.locator(`#edge [data-pool="${MODEL}"]`);
    // The three requests ran in the default band, gold; the page shows the
    // counters the control plane's latest poll of the edge holds.
    const admitted = async () =>
      (await cp.client.getEdgeStatus({ model: MODEL })).models[0]?.pool?.bands.find((b) => b.name === "gold")
        ?.admitted ?? 0n;
    await waitUntil("the edge's gold band counting the three requests", async () => (await admitted()) >= 3n);
    await onPage(() => pool.locator('tr[data-band="gold"] td:nth-child(3)').textContent()).toBe(
      String(await admitted()),
    );
    const status = (await cp.client.getEdgeStatus({ model: MODEL })).models[0]!;
    expect(await pool.locator("h3").textContent()).toContain(
      `endpoint set v${status.pool!.endpointsVersion}`,
    );
    const endpoint = status.pool!.endpoints[0]!;
    expect(await pool.locator(`tr[data-endpoint="${endpoint.id}"]`).textContent()).toContain("closed");
    // uPlot drew the three charts, each with the model in its legend.
    await onPage(() => page.locator("#edge .plot canvas").count()).toBe(3);
    expect(await page.locator("#edge .plot .u-legend").first().textContent()).toContain(MODEL);
  });

  it("shows each band's refusals for no endpoint and for no capacity", async () => {
    const band = async (model: string) =>
      (await cp.client.getEdgeStatus({ model })).models[0]?.pool?.bands.find((b) => b.name === "gold");
    await waitUntil(
      "the edge's gold band counting the two refusals",
      async () => ((await band(UNPLACED))?.noEndpoints ?? 0n) >= 2n,
    );
    const unplaced = page.locator(`#edge [data-pool="${UNPLACED}"] tr[data-band="gold"]`);
    const gold = (await band(UNPLACED))!;
    await onPage(() => unplaced.locator("td:nth-child(8)").textContent()).toBe(String(gold.noEndpoints));
    expect(await unplaced.locator("td:nth-child(9)").textContent()).toBe(String(gold.noCapacity));
    const headers = await page
      .locator(`#edge [data-pool="${UNPLACED}"] table`)
      .first()
      .locator("th")
      .allTextContents();
    expect(headers.slice(7)).toEqual(["Refused: no endpoint (503)", "Refused: no capacity (503)"]);
    // The served model refused nothing.
    const served = page.locator(`#edge [data-pool="${MODEL}"] tr[data-band="gold"]`);
    expect(await served.locator("td:nth-child(8)").textContent()).toBe("0");
    expect(await served.locator("td:nth-child(9)").textContent()).toBe("0");
  });

  it("a panel that fails shows its error in its place, and the rest of the page renders", async () => {
    const broken = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    try {
      // A browser whose canvas cannot draw: uPlot throws in the Edge panel's plots.
      await broken.addInitScript(() => {
        HTMLCanvasElement.prototype.getContext = () => {
          throw new Error("no canvas in this browser");
        };
      });
      await broken.goto(`${cp.adminUrl}/#token=${TOKEN}`);
      await onPage(() => broken.locator("#edge .panel-fault").textContent()).toContain(
        "no canvas in this browser",
      );
      await broken.locator(`#keys tr[data-key="${key.id}"]`).waitFor();
      await broken.locator("#fleet tr[data-node]").first().waitFor();
      expect(await broken.locator(".panel-fault").count()).toBe(1);
      await screenshot(broken, "dashboard", "panel-fault");
    } finally {
      await broken.close();
    }
  });

  it("shows the keys' usage totals from the edge, and which keys expire or have expired", async () => {
    const row = page.locator(`#keys tr[data-key="${key.id}"]`);
    await waitUntil("the edge counting the key's requests", async () => (await keyRequests()) >= 3n);
    await onPage(() => row.locator("td:nth-child(2)").textContent()).toBe(String(await keyRequests()));
    expect(await row.locator(".sub").textContent()).not.toContain("expire");
    const later = await createKey(edge, { expiresAtUnixMs: Date.parse("2099-06-01T12:00:00Z") });
    const gone = await createKey(edge, { expiresAtUnixMs: Date.now() - 60_000 });
    await onPage(() => page.locator(`#keys tr[data-key="${later.id}"] .sub`).textContent()).toMatch(
      /· expires .*2099/,
    );
    await onPage(() => page.locator(`#keys tr[data-key="${gone.id}"] .sub`).textContent()).toContain(
      "· expired",
    );
    await screenshot(page, "dashboard", "edge-and-keys");
  });

  it("shows each site of a pool, its health and its share of traffic, also for a site with no load feed", async () => {
    // A second site's set, written with the edge's token: the same sim
    // engine under another site's name. Its control plane pushes no load,
    // so the page has a site with no feed and no endpoint ready.
    const served = (await cp.client.getEdgeStatus({ model: MODEL })).models[0]!.pool!.endpoints[0]!;
    // The engine wants the key its control plane launched it with, which this set must carry too.
    const replica = (await cp.replicas()).find((r) => r.model === MODEL && r.shards.length > 0)!;
    const apiKey = engineKeyOf(join(cp.dir, "agents", replica.shards[0]!.node), replica.id);
    await edge.sync.putEndpointSets({
      site: "dash-b",
      endpoints: [{ id: "dash-b-0", url: served.url, models: [MODEL], apiKey }],
    });
    const sites = page.locator(`#edge [data-pool="${MODEL}"] table.sites`);
    const row = (site: string) => sites.locator(`tr[data-site="${site}"]`);
    await onPage(() => row("dash-b").textContent()).toContain("none");
    expect(await row("dash-b").locator("td:nth-child(3)").textContent()).toBe("0 of 1");
    expect(await row("default").locator("td:nth-child(4)").textContent()).toBe("live");
    // Requests until one is routed to site dash-b, then the page's shares are the pool's.
    const openai = clientFor(edge, key.secret);
    await waitUntil("a request routed to site dash-b", async () => {
      // Counted before it goes: a request the edge answers with an error is charged too.
      sent++;
      const { response } = await openai.chat.completions
        .create({ model: MODEL, messages: [{ role: "user", content: "which site?" }], max_tokens: 4 })
        .withResponse();
      return response.headers.get("x-llmgw-endpoint") === "dash-b-0@dash-b";
    });
    const routed = async () => {
      const p = (await cp.client.getEdgeStatus({ model: MODEL })).models[0]?.pool;
      return new Map(p?.sites.map((s) => [s.site, s]));
    };
    await waitUntil("the control plane's view counting dash-b's request", async () => {
      return ((await routed()).get("dash-b")?.routed ?? 0n) > 0n;
    });
    // The share is of the last minute's requests; this test's all fall in it.
    const shares = await routed();
    const total = [...shares.values()].reduce((a, s) => a + s.routedLastMinute, 0n);
    for (const [site, s] of shares) {
      await onPage(() => row(site).locator("td:nth-child(5)").textContent()).toBe(
        `${s.routed} (${s.routedLastMinute} in the last minute)`,
      );
      expect(await row(site).locator("[data-share]").textContent()).toBe(
        `${Math.round((Number(s.routedLastMinute) / Number(total)) * 100)}%`,
      );
    }
    await screenshot(page, "dashboard", "edge-sites");
    // Retired again, as docs/sites.md retires a site: the view goes with it.
    await edge.sync.putEndpointSets({ site: "dash-b", endpoints: [], allowEmpty: true });
    await onPage(() => sites.count()).toBe(0);
  });

  it("when the edge stops answering, Keys and Edge say so and keep the last figures", async () => {
    // The figure to keep is the settled one: a key without limits is charged up to a second after
    // its request, so the last request of the test before may still be on its way.
    const cell = page.locator(`#keys tr[data-key="${key.id}"] td:nth-child(2)`);
    await waitUntil(
      "the edge counting every request this file sent",
      async () => (await keyRequests()) === BigInt(sent),
    );
    await onPage(() => cell.textContent()).toBe(String(sent));
    const requests = await cell.textContent();
    await edge.stop();
    await onPage(() => page.locator("#keys .error").textContent()).toContain(
      "Key usage: the edge did not answer GetUsage:",
    );
    await onPage(() => page.locator("#edge .error").first().textContent()).toContain("Last poll failed:");
    expect(await page.locator(`#keys tr[data-key="${key.id}"] td:nth-child(2)`).textContent()).toBe(requests);
    expect(await page.locator(`#edge [data-pool="${MODEL}"]`).count()).toBe(1);
    await screenshot(page, "dashboard", "edge-down");
  });
});
