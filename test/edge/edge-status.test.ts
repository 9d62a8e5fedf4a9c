import { afterAll, describe, expect, it } from "vitest";
import { controlClient } from "../../cli/ctl/client.ts";
import { type ControlPlaneHandle, startControlPlane } from "../harness/fleet.ts";
import { waitUntil } from "../harness/process.ts";
import { clientFor, createKey, type Edge, type Sim, startEdge, startSim, stopStarted } from "./helpers.ts";

/**
 * The control plane's view of the edge (ControlService GetEdgeStatus): a
 * real control plane polling a real edge under `wrangler dev`, which routes
 * to a sim engine the control plane's config lists.
 */
describe("GetEdgeStatus", () => {
  let edge: Edge;
  let sim: Sim;
  let cp: ControlPlaneHandle | undefined;

  afterAll(async () => {
    await cp?.proc.kill();
    await stopStarted();
  });

  it("shows each model's pool as the edge last reported it, its age, the history, and a failed poll", async () => {
    [edge, sim] = await Promise.all([startEdge({}, "edge-status"), startSim("es")]);
    cp = await startControlPlane(
      [
        "edge:",
        `  url: ${edge.url}`,
        "  token_env: LLMGW_TEST_EDGE_TOKEN",
        "  status_interval: 1s",
        "control: { startup_grace: 1s }",
        "models: [{ name: es }]",
        "endpoints:",
        `  - { id: e1, url: "${sim.url}", models: [es] }`,
      ].join("\n"),
      { env: { LLMGW_TEST_EDGE_TOKEN: edge.token }, adminToken: "edge-status-admin-token" },
    );
    const status = () => cp!.client.getEdgeStatus({});
    await waitUntil("the control plane's view lists e1 in the es pool", async () => {
      const s = await status();
      return s.models.find((m) => m.model === "es")?.pool?.endpoints[0]?.id === "e1";
    });

    const key = await createKey(edge, { band: "platinum" });
    const openai = clientFor(edge, key.secret);
    for (const band of ["platinum", "gold", "gold"]) {
      await openai.chat.completions.create(
        { model: "es", messages: [{ role: "user", content: "hi" }], max_tokens: 2 },
        { headers: { "x-llmgw-band": band } },
      );
    }
    const admitted = (s: Awaited<ReturnType<typeof status>>) =>
      Object.fromEntries(
        (s.models.find((m) => m.model === "es")?.pool?.bands ?? []).map((b) => [b.name, Number(b.admitted)]),
      );
    await waitUntil("the three requests admitted in the view", async () => {
      const a = admitted(await status());
      return a.platinum === 1 && a.gold === 2;
    });
    const s = await status();
    expect(s.configured).toBe(true);
    expect(s.edgeUrl).toBe(edge.url);
    expect(s.pollIntervalMs).toBe(1_000);
    expect(s.lastError).toBe("");
    const es = s.models.find((m) => m.model === "es")!;
    expect(Number(es.ageMs)).toBeLessThan(5_000);
    expect(es.history.length).toBeGreaterThan(1);
    expect(Object.keys(es.history.at(-1)!.queueDepth).sort()).toEqual(
      es.pool!.bands.map((b) => b.name).sort(),
    );
    expect((await cp.client.getEdgeStatus({ model: "es" })).models.map((m) => m.model)).toEqual(["es"]);
    await expect(cp.client.getEdgeStatus({ model: "nope" })).rejects.toThrow(
      'the edge reported no pool for model "nope"',
    );

    // The edge goes away: the last pools stay, aging, and the poll's error shows.
    await edge.stop();
    await waitUntil("a failed poll in the view", async () => (await status()).lastError !== "");
    const down = await status();
    expect(Number(down.pollErrors)).toBeGreaterThan(0);
    expect(down.models.find((m) => m.model === "es")?.pool?.endpoints[0]?.id).toBe("e1");
    await waitUntil("the view's age grows past two poll intervals", async () => {
      const m = (await status()).models.find((x) => x.model === "es");
      return Number(m?.ageMs ?? 0) > 2_000;
    });
  }, 180_000);

  it("needs the admin token like every ControlService call", async () => {
    await expect(controlClient(cp!.adminUrl, "wrong-token-of-16+chars").getEdgeStatus({})).rejects.toThrow(
      "the admin token is not valid",
    );
  });
});
