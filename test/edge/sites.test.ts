import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { edgeSyncClient } from "../../common/edgesync-client.ts";
import type { PoolStatus } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { runLlmgw, waitUntil } from "../harness/process.ts";
import { parseExposition, sampleValue } from "../harness/prometheus.ts";
import { createKey, type Edge, startEdge, type TestKey } from "./helpers.ts";
import { bothSitesLive, poolOf, type Site, startSite, stopSite, SITE_TOKENS as TOKENS } from "./two-sites.ts";

/**
 * Two sites behind one edge (docs/sites.md), all real processes
 * (test/edge/two-sites.ts): the edge in workerd, and per site a control
 * plane with its site's token, an agent on simulated GPUs and the sim
 * engine it places. Both sites place the same model with the same profile,
 * so their replicas have the same id. Losing a site under load, and the
 * preference by location: sites-loss.test.ts.
 */
const MODEL = "sites-m";
const STALE_AFTER = "3s";

describe("two sites, one edge", () => {
  let edge: Edge;
  let key: TestKey;
  const sites: Site[] = [];

  const pool = (): Promise<PoolStatus> => poolOf(edge, MODEL);

  /** The endpoint that answered each of `n` requests, one after the other. */
  const served = async (n: number): Promise<string[]> => {
    const out: string[] = [];
    for (let i = 0; i < n; i++) {
      const res = await fetch(`${edge.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key.secret}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: MODEL,
          messages: [{ role: "user", content: `question ${i} ${Math.random()}` }],
          max_tokens: 4,
        }),
      });
      expect(res.status).toBe(200);
      await res.text();
      out.push(res.headers.get("x-llmgw-endpoint") ?? "");
    }
    return out;
  };

  beforeAll(async () => {
    edge = await startEdge({ stale_after: STALE_AFTER }, "edge-sites", {
      vars: { EDGE_SYNC_SITE_TOKENS: JSON.stringify(TOKENS) },
    });
    const o = { model: MODEL, staleAfter: STALE_AFTER };
    sites.push(await startSite(edge, "site-a", "sa-1", o), await startSite(edge, "site-b", "sb-1", o));
    key = await createKey(edge, { band: "gold" });
    await waitUntil(
      "both sites' replicas ready and live in the model's pool",
      () => bothSitesLive(edge, MODEL),
      90_000,
    );
  }, 120_000);

  afterAll(async () => {
    for (const s of sites) await stopSite(s);
    await edge?.stop();
  });

  it("keeps one set per site, each at its own version, and routes over their union", async () => {
    const p = await pool();
    expect(p.endpoints.map((e) => [e.id, e.site]).sort()).toEqual([
      [`${MODEL}/1gpu/0@site-a`, "site-a"],
      [`${MODEL}/1gpu/0@site-b`, "site-b"],
    ]);
    expect(p.sites.map((s) => [s.site, s.endpoints, s.loadFeed])).toEqual([
      ["site-a", 1, "live"],
      ["site-b", 1, "live"],
    ]);
    for (const s of p.sites) expect(s.version).toBeGreaterThan(0n);
    const answered = await served(12);
    expect(new Set(answered)).toEqual(new Set([`${MODEL}/1gpu/0@site-a`, `${MODEL}/1gpu/0@site-b`]));
    // A site's token reads the pools, as `ctl endpoints status` does with it.
    const ctl = await runLlmgw(["ctl", "endpoints", "status", MODEL, "--edge", edge.url], {
      LLMGW_EDGE_TOKEN: TOKENS["site-b"],
    });
    expect(ctl.stderr).toBe("");
    expect(ctl.stdout).toMatch(
      /sites: site-a v\d+ \(1 endpoints, load feed live\), site-b v\d+ \(1 endpoints, load feed live\)/,
    );
  }, 60_000);

  it("refuses a site's token everything but its own site's set and load, and changes nothing", async () => {
    const before = await pool();
    const a = edgeSyncClient(edge.url, TOKENS["site-a"]);
    const refused = async (call: Promise<unknown>): Promise<ConnectError> => {
      const err = await call.then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.PermissionDenied);
      return err as ConnectError;
    };
    const other = await refused(
      a.putEndpointSets({
        site: "site-b",
        allowEmpty: true,
        endpoints: [{ id: "hijack", url: "http://127.0.0.1:9/", models: [MODEL] }],
      }),
    );
    expect(other.rawMessage).toBe(
      `site: this token is site "site-a"'s, and cannot write site "site-b"'s endpoint set`,
    );
    await refused(a.pushLoad({ site: "site-b", loads: [{ endpointId: `${MODEL}/1gpu/0`, state: "down" }] }));
    const catalog = await refused(a.putCatalog({ models: [{ name: "other" }] }));
    expect(catalog.rawMessage).toContain("keys, the catalog and the router settings take the edge's token");
    await refused(a.listKeys({}));
    const after = await pool();
    expect(after.sites.map((s) => [s.site, s.version, s.endpoints])).toEqual(
      before.sites.map((s) => [s.site, s.version, s.endpoints]),
    );
    expect(after.endpoints.map((e) => [e.id, e.url, e.state])).toEqual(
      before.endpoints.map((e) => [e.id, e.url, e.state]),
    );
  }, 30_000);

  it("versions each site on its own, and refuses an id another site's endpoint has", async () => {
    const c = (version: bigint) =>
      edge.sync.putEndpointSets({
        site: "site-c",
        version,
        endpoints: [{ id: "c0", url: "http://127.0.0.1:9/", models: ["sites-other"] }],
      });
    // Site A and B are past version 1; site C's first set still takes it.
    expect(Math.min(...(await pool()).sites.map((s) => Number(s.version)))).toBeGreaterThan(1);
    expect((await c(1n)).version).toBe(1n);
    await expect(c(1n)).rejects.toThrow("version 1 is not newer than the stored version 1");
    const { pools } = await edge.sync.getPoolStatus({ model: "sites-other" });
    expect(pools[0]!.endpoints.map((e) => [e.id, e.site])).toEqual([["c0@site-c", "site-c"]]);
    // The default site's ids are not qualified, so one could name site A's endpoint.
    const clash = await edge.sync
      .putEndpointSets({
        endpoints: [{ id: `${MODEL}/1gpu/0@site-a`, url: "http://127.0.0.1:9/", models: [MODEL] }],
      })
      .then(
        () => undefined,
        (e: unknown) => e as ConnectError,
      );
    expect(clash?.code).toBe(Code.InvalidArgument);
    expect(clash?.rawMessage).toBe(
      `endpoints[0].id: "${MODEL}/1gpu/0@site-a" is already an endpoint of site "site-a"`,
    );
    expect((await pool()).endpoints).toHaveLength(2);
  }, 30_000);

  it("lets a site that stops pushing go stale and decay toward saturation 1; the other site takes the traffic", async () => {
    // Site A's control plane dies; its agent and engine keep running, so only the feed stops.
    await sites[0]!.cp.proc.kill("SIGKILL");
    await waitUntil(
      "site A's feed stale and its endpoint decayed to saturation 1, site B live",
      async () => {
        const p = await pool();
        const a = p.endpoints.find((e) => e.site === "site-a");
        const feeds = Object.fromEntries(p.sites.map((s) => [s.site, s.loadFeed]));
        return feeds["site-a"] === "stale" && feeds["site-b"] === "live" && (a?.saturation ?? 0) >= 1;
      },
      30_000,
    );
    const b = (await pool()).endpoints.find((e) => e.site === "site-b")!;
    expect(b.saturation).toBeLessThan(1);
    // Still in the pool: a site's stale feed is not its engines' death.
    expect((await pool()).endpoints).toHaveLength(2);
    expect(new Set(await served(8))).toEqual(new Set([`${MODEL}/1gpu/0@site-b`]));
    const ctl = await runLlmgw(["ctl", "endpoints", "status", MODEL, "--edge", edge.url], {
      LLMGW_EDGE_TOKEN: edge.token,
    });
    expect(ctl.stdout).toMatch(
      /sites: site-a v\d+ \(1 endpoints, load feed stale\), site-b v\d+ \(1 endpoints, load feed live\)/,
    );
    console.log(ctl.stdout);
    // Site B's control plane reads the same of the edge into its metrics, a `site` label on each.
    await waitUntil("site B's metrics show site A stale", async () => {
      const families = parseExposition(await sites[1]!.cp.metrics());
      const feed = (site: string, state: string) =>
        sampleValue(families, "llmgw_edge_site_load_feed", { model: MODEL, site, feed: state });
      return (
        feed("site-a", "stale") === 1 &&
        feed("site-a", "live") === 0 &&
        feed("site-b", "live") === 1 &&
        sampleValue(families, "llmgw_edge_site_endpoints", { model: MODEL, site: "site-a" }) === 1
      );
    });
  }, 60_000);
});
