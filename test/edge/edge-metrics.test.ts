import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ControlPlaneHandle, startControlPlane } from "../harness/fleet.ts";
import { waitUntil } from "../harness/process.ts";
import { parseExposition, sampleValue } from "../harness/prometheus.ts";
import {
  clientFor,
  createKey,
  type Edge,
  startEdge,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

/**
 * The control plane's `llmgw_edge_*` counters against what clients saw: a
 * band-mix overload through the edge under `wrangler dev` (as in
 * bands.test.ts: two slow sim engines, the pool judging saturation by its
 * own in-flight counts, small queues with a short queue_ttl), and the
 * control plane polling the edge's pools as in production.
 */
const BANDS = { gold: 4, silver: 4, bronze: 10 };
const PER_WORKER = 4;

describe("llmgw_edge_* counters under a band-mix overload", () => {
  let edge: Edge;
  let cp: ControlPlaneHandle;
  let key: TestKey;

  beforeAll(async () => {
    const [e, a, b] = await Promise.all([
      startEdge(
        {
          scoring: { target_inflight: 2 },
          admission: { queue_ttl: "1500ms", queue_capacity_per_band: 4 },
        },
        "edge-metrics",
      ),
      // Slow enough that gold and silver hold the pool above bronze's
      // ceiling for longer than its queue_ttl, even when a loaded machine
      // sends the clients' requests late.
      startSim("mix", ["--sim-speed", "0.25"]),
      startSim("mix", ["--sim-speed", "0.25"]),
    ]);
    edge = e;
    cp = await startControlPlane(
      [
        "edge:",
        `  url: ${edge.url}`,
        "  token_env: LLMGW_TEST_EDGE_TOKEN",
        "  status_interval: 1s",
        "control: { startup_grace: 1s }",
        "models: [{ name: mix }]",
        "endpoints:",
        `  - { id: mix-a, url: "${a.url}", models: [mix] }`,
        `  - { id: mix-b, url: "${b.url}", models: [mix] }`,
      ].join("\n"),
      { env: { LLMGW_TEST_EDGE_TOKEN: edge.token }, adminToken: "edge-metrics-admin-token" },
    );
    key = await createKey(edge, { band: "platinum" });
    await waitUntil("the control plane's endpoints in the mix pool", async () => {
      const { pools } = await edge.sync.getPoolStatus({ model: "mix" });
      return pools[0]?.endpoints.length === 2;
    });
  }, 120_000);

  afterAll(async () => {
    await cp?.proc.kill();
    await stopStarted();
  });

  /** One streamed request in `band`: its status and error code as the client saw them. */
  async function ask(band: string, n: number): Promise<string> {
    try {
      const stream = await clientFor(edge, key.secret).chat.completions.create(
        { model: "mix", messages: [{ role: "user", content: `${band} ${n}` }], max_tokens: 16, stream: true },
        { headers: { "x-llmgw-band": band } },
      );
      for await (const _ of stream);
      return "200";
    } catch (err) {
      const e = err as { status?: number; code?: string | null };
      return `${e.status} ${e.code}`;
    }
  }

  it("admitted, full (429) and expired (503) per band equal what the clients got", async () => {
    const seen: Record<string, string[]> = { gold: [], silver: [], bronze: [] };
    await Promise.all(
      Object.entries(BANDS).flatMap(([band, workers]) =>
        Array.from({ length: workers }, async (_, w) => {
          for (let i = 0; i < PER_WORKER; i++) seen[band]!.push(await ask(band, w * PER_WORKER + i));
        }),
      ),
    );
    const count = (band: string, outcome: string) => seen[band]!.filter((s) => s === outcome).length;
    for (const band of Object.keys(BANDS))
      for (const s of seen[band]!) expect(["200", "429 queue_full", "503 queue_timeout"], band).toContain(s);
    // An overload, or this test proves nothing: bronze was shed both ways.
    expect(count("bronze", "429 queue_full"), `bronze: ${seen.bronze!.join(", ")}`).toBeGreaterThan(0);
    expect(count("bronze", "503 queue_timeout"), `bronze: ${seen.bronze!.join(", ")}`).toBeGreaterThan(0);

    const want: Record<string, number> = {};
    for (const band of Object.keys(BANDS)) {
      want[`${band} admitted`] = count(band, "200");
      want[`${band} full`] = count(band, "429 queue_full");
      want[`${band} expired`] = count(band, "503 queue_timeout");
      want[`${band} abandoned`] = 0;
      want[`${band} no_endpoints`] = 0;
      want[`${band} no_capacity`] = 0;
    }
    const exported = async () => {
      const f = parseExposition(await cp.metrics()).get("llmgw_edge_requests_total");
      const got: Record<string, number> = {};
      for (const s of f?.samples ?? [])
        if (s.labels.model === "mix" && s.labels.band! in BANDS)
          got[`${s.labels.band} ${s.labels.outcome}`] = s.value;
      return got;
    };
    // The control plane polls every second: wait for the poll after the last request (a
    // timeout falls through to the comparison, which shows the difference).
    await waitUntil("the exported counters to reach the clients' counts", async () => {
      const got = await exported();
      return Object.entries(want).every(([k, v]) => got[k] === v);
    }).catch(() => undefined);
    expect(await exported()).toEqual(want);

    const families = parseExposition(await cp.metrics());
    const value = (name: string, labels: Record<string, string> = {}) => sampleValue(families, name, labels);
    // Every expired request had waited in its queue, and the queues are empty now.
    for (const band of Object.keys(BANDS)) {
      expect(value("llmgw_edge_queued_total", { model: "mix", band })).toBeGreaterThanOrEqual(
        count(band, "503 queue_timeout"),
      );
      expect(value("llmgw_edge_queue_depth", { model: "mix", band })).toBe(0);
    }
    // Each admitted request was one pick.
    const picks = families
      .get("llmgw_edge_route_decisions_total")
      ?.samples.filter((s) => s.labels.model === "mix")
      .reduce((sum, s) => sum + s.value, 0);
    expect(picks).toBe(Object.keys(BANDS).reduce((sum, band) => sum + count(band, "200"), 0));
    expect(value("llmgw_edge_breakers", { model: "mix", state: "closed" })).toBe(2);
    expect(value("llmgw_edge_fail_opens_total", { model: "mix" })).toBe(0);
  }, 180_000);
});
