import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killEngines } from "../../agent/kill-engines.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import { type Proc, waitUntil } from "../harness/process.ts";

/**
 * router.scrape_interval is the control plane's to set: agents scrape their
 * engines at the interval the control plane tells them when they register,
 * and again when a reload changes it — what the edge's `stale_after`
 * assumes. Observed through ControlService: each scrape stamps the replica's
 * load with a new time.
 */
const CONFIG = `
control:
  interval: 1s
  startup_grace: 1s
  heartbeat_interval: 300ms
router:
  scrape_interval: 10s
models:
  - name: tiny
    profiles:
      - name: 1gpu
        engine: vllm
        source: sim/tiny
        engine_args: ["--max-model-len", "4096", "--sim-speed", "50"]
        replicas: { min: 1 }
        startup_deadline: 60s
`;

describe("scrape settings (real processes)", () => {
  let cp: ControlPlaneHandle;
  let agent: Proc;

  beforeAll(async () => {
    cp = await startControlPlane(CONFIG);
    agent = startAgent(cp, "s1", { gpus: "1xH100-80GB", extra: ["--vllm-bin", "test/bin/vllm"] });
  });

  afterAll(async () => {
    await agent?.kill();
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
  });

  const scrapedAt = async (): Promise<string | undefined> => {
    const r = (await cp.client.listReplicas({})).replicas[0];
    const at = r?.shards[0]?.load?.scrapedAtUnixMs;
    return at ? String(at) : undefined;
  };

  it("agents scrape at the interval a reload sets, not at their own default", async () => {
    await waitUntil("tiny ready and scraped", scrapedAt, 60_000);
    writeFileSync(
      cp.configPath,
      readFileSync(cp.configPath, "utf8").replace("scrape_interval: 10s", "scrape_interval: 250ms"),
    );
    cp.proc.child.kill("SIGHUP");
    // Eight fresh scrapes inside 4 s: at the agent's own 2 s default (or the
    // 10 s before the reload) that would take 16 s or more.
    const seen = new Set<string>();
    await waitUntil(
      "eight scrapes",
      async () => {
        const at = await scrapedAt();
        if (at) seen.add(at);
        return seen.size >= 9;
      },
      4_000,
      50,
    );
    expect(seen.size).toBeGreaterThanOrEqual(9);
  });
});
