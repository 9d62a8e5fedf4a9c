import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Client } from "@connectrpc/connect";
import { controlClient } from "../../controlplane/ctl/client.ts";
import { type NodeJson, nodeJson } from "../../controlplane/ctl/nodes.ts";
import type { ControlService } from "../../proto/gen/control/v1/control_pb.ts";
import { freePort, type Proc, runLlmgw, startLlmgw } from "./process.ts";

/** A control plane on loopback with its own ports, config file and data dir. */
export interface ControlPlaneHandle {
  proc: Proc;
  dir: string;
  configPath: string;
  agentUrl: string;
  adminUrl: string;
  client: Client<typeof ControlService>;
  nodes(): Promise<NodeJson[]>;
  /** `llmgw ctl ARGS` against this control plane, as an operator runs it. */
  ctl(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }>;
  restart(): Promise<void>;
}

export function tempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `llmgw-${prefix}-`));
}

export async function startControlPlane(
  configBody: string,
  opts: { dir?: string; env?: NodeJS.ProcessEnv; agentPort?: number; adminPort?: number } = {},
): Promise<ControlPlaneHandle> {
  const dir = opts.dir ?? tempDir("cp");
  const agentPort = opts.agentPort ?? (await freePort());
  const adminPort = opts.adminPort ?? (await freePort());
  const configPath = join(dir, "llmgw.yaml");
  writeFileSync(
    configPath,
    `agent_listen: 127.0.0.1:${agentPort}\nadmin_listen: 127.0.0.1:${adminPort}\ndata_dir: ${join(dir, "data")}\n${configBody}`,
  );
  const adminUrl = `http://127.0.0.1:${adminPort}`;
  const launch = async () => {
    const p = startLlmgw("control-plane", ["server", "--config", configPath], opts.env);
    await p.waitFor("control plane listening");
    return p;
  };
  const handle: ControlPlaneHandle = {
    proc: await launch(),
    dir,
    configPath,
    agentUrl: `http://127.0.0.1:${agentPort}`,
    adminUrl,
    client: controlClient(adminUrl),
    async nodes() {
      const { nodes } = await handle.client.listNodes({});
      return nodes.map(nodeJson);
    },
    ctl: (...args) => runLlmgw(["ctl", ...args, "--control-plane", adminUrl]),
    async restart() {
      handle.proc = await launch();
    },
  };
  return handle;
}

export interface AgentOptions {
  gpus?: string;
  fabric?: Record<string, string>;
  extra?: string[];
  stateDir?: string;
}

export function startAgent(cp: ControlPlaneHandle, node: string, o: AgentOptions = {}): Proc {
  const stateDir = o.stateDir ?? join(cp.dir, "agents", node);
  mkdirSync(stateDir, { recursive: true });
  const args = [
    "agent",
    "--control-plane",
    cp.agentUrl,
    "--node",
    node,
    "--simulate-gpus",
    o.gpus ?? "8xH100-80GB",
    "--advertise-address",
    "127.0.0.1",
    "--state-dir",
    stateDir,
    ...Object.entries(o.fabric ?? {}).flatMap(([k, v]) => ["--fabric", `${k}=${v}`]),
    ...(o.extra ?? []),
  ];
  return startLlmgw(`agent-${node}`, args);
}
