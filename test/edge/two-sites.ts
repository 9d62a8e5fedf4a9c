import { join } from "node:path";
import { killEngines } from "../../agent/kill-engines.ts";
import type { PoolStatus } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { type ControlPlaneHandle, startAgent, startControlPlane } from "../harness/fleet.ts";
import type { Proc } from "../harness/process.ts";
import type { Edge } from "./helpers.ts";

/**
 * Two sites behind one edge (docs/sites.md), all real processes: per site a
 * control plane holding its site's token, an agent on simulated GPUs, and
 * the sim engine it places. Both sites place the same model with the same
 * profile, so their replicas have the same id (`…/0@site-a`, `…/0@site-b`).
 */
export const SITE_TOKENS = {
  "site-a": "site-a-token-0123456789abcdef",
  "site-b": "site-b-token-0123456789abcdef",
} as const;
export type SiteName = keyof typeof SITE_TOKENS;

export interface Site {
  name: SiteName;
  node: string;
  cp: ControlPlaneHandle;
  agent: Proc;
}

export interface SiteOptions {
  model: string;
  staleAfter: string;
  /** The sim engine's args beyond the context length. */
  engineArgs?: readonly string[];
}

export async function startSite(
  edge: Pick<Edge, "url">,
  name: SiteName,
  node: string,
  o: SiteOptions,
): Promise<Site> {
  const args = ["--max-model-len", "4096", ...(o.engineArgs ?? ["--sim-speed", "50"])];
  const cp = await startControlPlane(
    `
site: ${name}
edge:
  url: ${edge.url}
  token_env: LLMGW_TEST_EDGE_TOKEN
  status_interval: 1s
router:
  scrape_interval: 500ms
  stale_after: ${o.staleAfter}
control:
  startup_grace: 1s
  interval: 1s
models:
  - name: ${o.model}
    profiles:
      - name: 1gpu
        engine: vllm
        source: test/${o.model}
        engine_args: ${JSON.stringify(args)}
        replicas: { min: 1 }
        startup_deadline: 60s
`,
    { env: { LLMGW_TEST_EDGE_TOKEN: SITE_TOKENS[name] } },
  );
  return { name, node, cp, agent: startSiteAgent(cp, node) };
}

function startSiteAgent(cp: ControlPlaneHandle, node: string): Proc {
  return startAgent(cp, node, { gpus: "1xH100-80GB", extra: ["--vllm-bin", "test/bin/vllm"] });
}

/** A site's whole fleet `kill -9`ed at once: its control plane, its agent, and the engines the agent left. */
export async function killSite(site: Site): Promise<void> {
  await Promise.all([site.cp.proc.kill("SIGKILL"), site.agent.kill("SIGKILL")]);
  killEngines(join(site.cp.dir, "agents"));
}

/** The site back from its state on disk: its control plane, then its agent, which places its engine again. */
export async function restartSite(site: Site): Promise<void> {
  await site.cp.restart();
  site.agent = startSiteAgent(site.cp, site.node);
}

export async function stopSite(site: Site): Promise<void> {
  await site.agent.kill();
  await site.cp.proc.kill();
  killEngines(join(site.cp.dir, "agents"));
}

/** The model's pool at the edge. */
export async function poolOf(edge: Pick<Edge, "sync">, model: string): Promise<PoolStatus> {
  const { pools } = await edge.sync.getPoolStatus({ model });
  return pools[0]!;
}

/** Both sites' replicas ready, each site's load feed live. */
export async function bothSitesLive(edge: Pick<Edge, "sync">, model: string): Promise<boolean> {
  const p = await poolOf(edge, model).catch(() => undefined);
  return (
    p?.endpoints.filter((e) => e.state === "ready").length === 2 &&
    p.sites.length === 2 &&
    p.sites.every((s) => s.loadFeed === "live")
  );
}
