import { appendFileSync } from "node:fs";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { launchChromium, screenshot } from "../harness/browser.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

const TOKEN = "dashboard-test-admin-token-0123456789";
const UNREACHABLE_AFTER_MS = 2_000;

const CONFIG = `
control:
  interval: 1s
  startup_grace: 1s
  heartbeat_interval: 300ms
  unreachable_after: ${UNREACHABLE_AFTER_MS}ms
  lost_after: 60s
`;
// "tiny" fits a node of one GPU; "wide" asks for four GPUs, which no node has.
const MODELS = `
models:
  - name: tiny
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/tiny
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 1 }
        startup_deadline: 60s
        stop_grace: 5s
  - name: wide
    profiles:
      - name: tp4
        engine: vllm
        source: sim/wide
        tensor_parallel: 4
        engine_args: ["--max-model-len", "4096"]
        replicas: { min: 1 }
`;

describe("the dashboard in headless Chromium, against a real control plane and agents", () => {
  let cp: ControlPlaneHandle;
  const agents: Record<string, Proc> = {};
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG, { adminToken: TOKEN });
    const extra = ["--vllm-bin", "test/bin/vllm"];
    for (const node of ["dash-1", "dash-2"])
      agents[node] = startAgent(cp, node, { gpus: "1xH100-80GB", fabric: { ib: "island-1" }, extra });
    await waitUntil(
      "two nodes ready",
      async () => (await cp.nodes()).filter((n) => n.state === "ready").length === 2,
    );
    appendFileSync(cp.configPath, MODELS);
    cp.proc.child.kill("SIGHUP");
    await waitUntil("tiny ready", async () => (await cp.replicas()).some((r) => r.state === "ready"), 45_000);
    browser = await launchChromium();
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await Promise.all(Object.values(agents).map((a) => a.kill()));
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  // The page refreshes every 1.5 s; vitest's expect.poll gives up after 1 s unless told.
  const onPage = <T>(read: () => Promise<T>, timeout = 10_000) =>
    expect.poll(read, { timeout, interval: 100 });
  const PANEL = { node: "#fleet", replica: "#replicas", model: "#models" } as const;
  const row = (kind: keyof typeof PANEL, name: string) =>
    page.locator(`${PANEL[kind]} tr[data-${kind}="${name}"]`);

  it("a wrong token gets a clear sign-in error, from the link and from the form", async () => {
    page = await browser.newPage();
    await page.goto(`${cp.adminUrl}/#token=not-the-admin-token-at-all`);
    const alert = page.getByRole("alert");
    await onPage(() => alert.textContent()).toBe(
      "The control plane refused the admin token: the admin token is not valid for this control plane",
    );
    await page.getByLabel("Admin token").fill("still-not-the-admin-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    await onPage(() => alert.textContent()).toBe(
      "Sign-in failed: the admin token is not valid for this control plane",
    );
    await screenshot(page, "dashboard", "wrong-token");
    expect(await page.locator("#fleet").count()).toBe(0);
    await page.close();
  });

  it("signs in from the link and lists the nodes, the replicas and the models", async () => {
    page = await browser.newPage();
    await page.goto(`${cp.adminUrl}/#token=${TOKEN}`);
    await row("node", "dash-1").waitFor();
    // The token left the address bar, and stays in this tab's sessionStorage only.
    expect(page.url()).toBe(`${cp.adminUrl}/`);
    for (const node of ["dash-1", "dash-2"]) {
      await onPage(() => row("node", node).getAttribute("data-state")).toBe("ready");
      expect(await row("node", node).textContent()).toContain("ib=island-1");
    }
    const [tiny] = (await cp.client.listReplicas({})).replicas.filter((r) => r.model === "tiny");
    const host = tiny!.shards[0]!.nodeName;
    await onPage(() => row("replica", tiny!.id).getAttribute("data-state")).toBe("ready");
    expect(await row("replica", tiny!.id).locator(".shard").getAttribute("data-node")).toBe(host);
    // The GPU the replica holds is attributed to it in Fleet.
    expect(await page.locator(`[data-gpu="${host}/0"] .gpu-holder`).textContent()).toBe(tiny!.id);

    await onPage(() => row("model", "tiny").getAttribute("data-ready")).toBe("1");
    expect(await row("model", "wide").getAttribute("data-ready")).toBe("0");
    // The model that cannot run is explained with ctl explain's own lines.
    const { lines } = await cp.client.explain({ model: "wide" });
    expect(lines.length).toBeGreaterThan(0);
    expect(await row("model", "wide").locator("pre.explain").textContent()).toBe(lines.join("\n"));
    // No edge link here, so Keys says where usage lives rather than showing nothing.
    await onPage(() => page.locator("#keys .error").textContent()).toContain(
      "this control plane has no edge link",
    );
    expect(await page.locator("#edge").textContent()).toContain("This control plane has no edge link");
    await screenshot(page, "dashboard", "signed-in");
  });

  it("renders every panel in a browser started under the POSIX locale C.UTF-8", async () => {
    const posix = await launchChromium({ locale: "C.UTF-8" });
    try {
      const p = await posix.newPage();
      // The premise: under C.UTF-8 Chromium reports a language no Intl constructor accepts.
      expect(await p.evaluate(() => navigator.language)).toBe("en-US@posix");
      await p.goto(`${cp.adminUrl}/#token=${TOKEN}`);
      await p.locator('#fleet tr[data-node="dash-2"]').waitFor();
      expect(p.url()).toBe(`${cp.adminUrl}/`);
      for (const panel of ["#fleet", "#replicas", "#models", "#edge", "#keys", "#actions"])
        expect(await p.locator(`${panel} h2`).count(), panel).toBe(1);
      expect(await p.locator(".panel-fault").count()).toBe(0);
      await screenshot(p, "dashboard", "posix-locale");
    } finally {
      await posix.close();
    }
  });

  it("cordon and uncordon each ask first; Cancel changes nothing", async () => {
    const [tiny] = (await cp.client.listReplicas({})).replicas.filter((r) => r.model === "tiny");
    const node = tiny!.shards[0]!.nodeName === "dash-1" ? "dash-2" : "dash-1";
    const cordoned = async () => (await cp.client.getNode({ name: node })).node!.cordoned;
    const dialog = page.getByRole("dialog");

    await row("node", node).locator('button[data-action="cordon"]').click();
    await dialog.getByRole("button", { name: "Cancel" }).click();
    expect(await dialog.count()).toBe(0);
    expect(await cordoned()).toBe(false);

    await row("node", node).locator('button[data-action="cordon"]').click();
    await dialog.locator('button[data-confirm="cordon"]').click();
    await onPage(() => row("node", node).getAttribute("data-state")).toBe("cordoned");
    expect(await cordoned()).toBe(true);

    await row("node", node).locator('button[data-action="uncordon"]').click();
    await dialog.locator('button[data-confirm="uncordon"]').click();
    await onPage(() => row("node", node).getAttribute("data-state")).toBe("ready");
    expect(await cordoned()).toBe(false);
  });

  it("a drain clicked on the page moves the replica to the other node", async () => {
    const [tiny] = (await cp.client.listReplicas({})).replicas.filter((r) => r.model === "tiny");
    const from = tiny!.shards[0]!.nodeName;
    const to = from === "dash-1" ? "dash-2" : "dash-1";
    await row("node", from).locator('button[data-action="drain"]').click();
    const dialog = page.getByRole("dialog");
    expect(await dialog.locator("h3").textContent()).toBe(`Drain ${from}?`);
    await screenshot(page, "dashboard", "drain-confirmation");
    await dialog.locator('button[data-confirm="drain"]').click();
    await onPage(() => page.locator("#actions .log li").first().textContent()).toContain(`drain ${from}`);
    expect(await page.locator("#actions .log li").first().textContent()).toContain(`drain ${from}: done`);

    await onPage(() => row("node", from).getAttribute("data-state")).toBe("draining");
    // ControlService lists tiny ready on the other node, and nothing left on the drained one…
    const tinyPlaces = async () =>
      (await cp.client.listReplicas({})).replicas
        .filter((r) => r.model === "tiny")
        .map((r) => `${r.state} on ${r.shards.map((s) => s.nodeName).join(",")}`);
    await waitUntil(
      "tiny moved",
      async () => JSON.stringify(await tinyPlaces()) === JSON.stringify([`ready on ${to}`]),
      45_000,
      250,
    );
    // …and so does the page.
    const pageTiny = page.locator('#replicas tr[data-model="tiny"]');
    await onPage(async () =>
      (await pageTiny.count()) === 1
        ? `${await pageTiny.getAttribute("data-state")} on ${await pageTiny.locator(".shard").getAttribute("data-node")}`
        : `${await pageTiny.count()} rows`,
    ).toBe(`ready on ${to}`);
  });

  it("a killed agent's node turns unreachable on the page, the others stay ready", async () => {
    await agents["dash-1"]!.kill("SIGKILL");
    // When the control plane calls it unreachable is controlplane/registry.test.ts's; here,
    // that the page shows it, with a deadline far past unreachable_after and a page poll.
    await page.locator('#fleet tr[data-node="dash-1"][data-state="unreachable"]').waitFor({
      timeout: 30_000,
    });
    expect(await row("node", "dash-2").getAttribute("data-state")).toBe("ready");
    await screenshot(page, "dashboard", "unreachable");
  });
});
