import { spawn } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Code, type ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { controlClient } from "../../cli/ctl/client.ts";
import { nodeJson } from "../../cli/ctl/nodes.ts";
import { edgeSyncClient } from "../../common/edgesync-client.ts";
import type { SiteRow } from "../../common/site-shares.ts";
import { runCurl, type StackRun, stackPorts, stackProcesses, startStack } from "../../scripts/stack-run.ts";
import { launchChromium, screenshot } from "../harness/browser.ts";
import { tempDir } from "../harness/fleet.ts";
import { REPO, waitUntil } from "../harness/process.ts";
import { parseExposition, sampleValue } from "../harness/prometheus.ts";

/**
 * `npm start -- --sites 2` as a user runs it (docs/sites.md): two control
 * planes, each a site with its own agents and sim engines, behind one edge.
 * Both sites serve the model, the banner's `ctl status` line for each site
 * shows both sites' health and share, the dashboard too, Ctrl-C stops
 * everything; and a plain `npm start` on the same state directory after it
 * retires the two sites' sets instead of routing to them.
 */
const SITES = ["site-a", "site-b"] as const;
const MODEL = "llama-3.1-8b-instruct";

/** One line of the banner run as printed, through sh, from the repository. */
function sh(line: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn("sh", ["-c", line], { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c: Buffer) => {
    stdout += c;
  });
  child.stderr.on("data", (c: Buffer) => {
    stderr += c;
  });
  return new Promise((resolve) => child.once("exit", (code) => resolve({ code, stdout, stderr })));
}

/** The endpoint that answered one short chat through the edge. */
async function answeredBy(edge: string, key: string): Promise<string> {
  const res = await fetch(`${edge}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: "llama-8b",
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 4,
    }),
  });
  expect(res.status, await res.clone().text()).toBe(200);
  await res.text();
  return res.headers.get("x-llmgw-endpoint") ?? "";
}

describe("npm start -- --sites 2 (real processes)", () => {
  const stateDir = tempDir("npm-start-sites");
  let run: StackRun | undefined;

  afterAll(() => {
    run?.destroy();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it("runs two sites behind one edge, both serving, each shown with its share; a later one-site start retires them", async () => {
    const ports = await stackPorts(2);
    const edge = `http://127.0.0.1:${ports.edge}`;
    run = startStack(stateDir, ports, 240_000, ["--sites", "2"]);
    const banner = await run.banner;
    const text = run.output().slice(run.output().indexOf("llmgw local stack is up"));
    expect(text).toContain(": 2 sites behind one edge");

    // Both sites registered: each control plane, on its own port with its own admin token, has its two nodes.
    const adminTokens = SITES.map((s) =>
      readFileSync(join(stateDir, "sites", s, "admin.token"), "utf8").trim(),
    );
    expect(adminTokens[0]).not.toBe(adminTokens[1]);
    for (const [k, site] of SITES.entries()) {
      const control = controlClient(`http://127.0.0.1:${ports.admin + k}`, adminTokens[k]!);
      const nodes = (await control.listNodes({})).nodes.map(nodeJson);
      expect(
        nodes.map((n) => [n.name, n.state]),
        site,
      ).toEqual([
        ["gpu-node-1", "ready"],
        ["gpu-node-2", "ready"],
      ]);
    }

    // Site B holds a token of its own at the edge: it reads the pools, and may not write the catalog.
    const siteToken = readFileSync(join(stateDir, "sites", "site-b", "edge.token"), "utf8").trim();
    const edgeToken = readFileSync(join(stateDir, "edge.token"), "utf8").trim();
    expect(siteToken).not.toBe(edgeToken);
    const asSiteB = edgeSyncClient(edge, siteToken);
    expect((await asSiteB.getPoolStatus({ model: MODEL })).pools[0]!.sites.map((s) => s.site)).toEqual([
      "site-a",
      "site-b",
    ]);
    const refused = await asSiteB.putCatalog({ models: [] }).catch((e: unknown) => e);
    expect((refused as ConnectError).code).toBe(Code.PermissionDenied);

    // The model is served from endpoints of both sites.
    const seen = new Set<string>();
    await waitUntil(
      "answers from both sites' endpoints",
      async () => {
        seen.add((await answeredBy(edge, banner.key)).replace(/^.*@/, ""));
        return SITES.every((s) => seen.has(s));
      },
      60_000,
    );
    expect([...seen].sort()).toEqual([...SITES]);
    const curl = await runCurl(banner.curl);
    expect(curl.status, curl.output).toBe(200);

    // Each site's ctl line from the banner; both see every site, once their poll of the edge counts both.
    const ctlLines = [
      ...text.matchAll(/^ {2}(LLMGW_ADMIN_TOKEN=\$\(cat \S+\) npx llmgw ctl status --control-plane \S+)$/gm),
    ];
    expect(ctlLines.map((m) => m[1]!.split(" ").at(-1))).toEqual([
      `http://127.0.0.1:${ports.admin}`,
      `http://127.0.0.1:${ports.admin + 1}`,
    ]);
    for (const [k, m] of ctlLines.entries()) {
      const control = controlClient(`http://127.0.0.1:${ports.admin + k}`, adminTokens[k]!);
      // Traffic reaches a site once one of its endpoints is ready; the other's first scrape may come later.
      await waitUntil(
        `site ${SITES[k]}'s view of the edge counting both sites' requests, every endpoint ready and fed`,
        async () => {
          const pool = (await control.getEdgeStatus({ model: MODEL })).models[0]?.pool;
          return SITES.every((s) => {
            const site = pool?.sites.find((p) => p.site === s);
            const endpoints = pool?.endpoints.filter((e) => e.site === s) ?? [];
            return (
              (site?.routed ?? 0n) > 0n &&
              site?.loadFeed === "live" &&
              endpoints.length === 2 &&
              endpoints.every((e) => e.state === "ready")
            );
          });
        },
      );
      const out = await sh(m[1]!);
      expect(out.code, out.stderr).toBe(0);
      for (const site of SITES)
        expect(out.stdout).toMatch(
          new RegExp(`^${MODEL}\\s+${site}\\s+v\\d+\\s+2\\s+2\\s+live\\s+[1-9]\\d*\\s+\\d+\\s+\\d+%$`, "m"),
        );
      const json = await sh(`${m[1]!} --json`);
      const rows = (JSON.parse(json.stdout) as { sites: SiteRow[] }).sites.filter((r) => r.model === MODEL);
      expect(rows.map((r) => [r.site, r.endpoints, r.ready, r.loadFeed])).toEqual([
        ["site-a", 2, 2, "live"],
        ["site-b", 2, 2, "live"],
      ]);
      expect(rows.reduce((sum, r) => sum + (r.share ?? 0), 0)).toBeCloseTo(1, 6);
    }

    // Site A's metrics count each site's routed requests too (docs/metrics.md).
    const metrics = await fetch(`http://127.0.0.1:${ports.admin}/metrics`, {
      headers: { authorization: `Bearer ${adminTokens[0]}` },
    });
    const families = parseExposition(await metrics.text());
    for (const site of SITES)
      expect(
        sampleValue(families, "llmgw_edge_site_routed_requests_total", { model: MODEL, site }),
        site,
      ).toBeGreaterThan(0);

    // Site A's dashboard, from the banner's link, shows both sites under the model's pool.
    const browser = await launchChromium();
    try {
      const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
      await page.goto(banner.dashboard);
      for (const site of SITES) {
        const row = page.locator(`#edge [data-pool="${MODEL}"] table.sites tr[data-site="${site}"]`);
        await expect.poll(() => row.textContent(), { timeout: 15_000 }).toContain("live");
      }
      await screenshot(page, "npm-start", "dashboard-sites");
    } finally {
      await browser.close();
    }

    const stopped = await run.interrupt();
    expect(stopped.code).toBe(0);
    expect(stackProcesses(run.mark), run.output().slice(-3000)).toEqual([]);

    // One site again on the same state directory: the two sites' sets are emptied, none of their ids is routed.
    run = startStack(stateDir, ports);
    await run.banner;
    expect(run.output()).toContain(
      "emptied the endpoint sets a previous start left at the edge for: site-a, site-b",
    );
    // The banner comes once the stack answers; its second replica may reach the pool a push later.
    const sync = edgeSyncClient(edge, edgeToken);
    const pool = await waitUntil(
      "the one site's two replicas, and only they, in the pool",
      async () => {
        const p = (await sync.getPoolStatus({ model: MODEL })).pools[0];
        return p && p.endpoints.length >= 2 ? p : undefined;
      },
      30_000,
    );
    expect(pool.sites.map((s) => s.site)).toEqual(["default"]);
    expect(pool.endpoints.map((e) => e.id).sort()).toEqual([`${MODEL}/1gpu/0`, `${MODEL}/1gpu/1`]);
    const again = await run.interrupt();
    expect(again.code).toBe(0);
    expect(stackProcesses(run.mark)).toEqual([]);
  }, 600_000);
});
