import { join } from "node:path";
import { killEngines } from "../../agent/kill-engines.ts";
import { type Edge, startEdge } from "../edge/helpers.ts";
import { type AgentOptions, type ControlPlaneHandle, startAgent, startControlPlane } from "./fleet.ts";
import { type Proc, waitUntil } from "./process.ts";

/**
 * What the operator-facing tests look at: an edge in workerd, a control
 * plane publishing to it and polling its pools every second, and one agent
 * on simulated GPUs running sim engines through the vLLM adapter. Ready
 * once `routed`'s replica serves at the edge, as the control plane's own
 * view of the edge reports it.
 */
export interface LinkedStack {
  edge: Edge;
  cp: ControlPlaneHandle;
  agent: Proc;
  stop(): Promise<void>;
}

export async function startLinkedStack(o: {
  tag: string;
  adminToken: string;
  /** The `models:` list, as YAML items. */
  models: string;
  node: string;
  agent: AgentOptions;
  routed: string;
}): Promise<LinkedStack> {
  const edge = await startEdge({}, o.tag);
  let cp: ControlPlaneHandle | undefined;
  let agent: Proc | undefined;
  // Whatever started is stopped, also when the start fails part way.
  const stop = async () => {
    await agent?.kill();
    await cp?.proc.kill();
    if (cp) killEngines(join(cp.dir, "agents"));
    await edge.stop();
  };
  try {
    cp = await startControlPlane(
      `
edge:
  url: ${edge.url}
  token_env: LLMGW_TEST_EDGE_TOKEN
  status_interval: 1s
router:
  scrape_interval: 500ms
control:
  startup_grace: 1s
  interval: 1s
models:
${o.models}`,
      { env: { LLMGW_TEST_EDGE_TOKEN: edge.token }, adminToken: o.adminToken },
    );
    agent = startAgent(cp, o.node, {
      ...o.agent,
      extra: ["--vllm-bin", "test/bin/vllm", ...(o.agent.extra ?? [])],
    });
    const client = cp.client;
    await waitUntil(
      `${o.routed} ready and routed at the edge`,
      async () => {
        const s = await client.getEdgeStatus({ model: o.routed }).catch(() => undefined);
        return s?.models[0]?.pool?.endpoints.some((e) => e.state === "ready") ?? false;
      },
      90_000,
    );
    return { edge, cp, agent, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
