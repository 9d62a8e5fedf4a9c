/**
 * A fleet on loopback, as the integration tests and the benchmarks run
 * one: a control plane with its own ports, config file and data dir, and
 * agents playing GPU nodes, each on a loopback address of its own.
 */
import { mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Client } from "@connectrpc/connect";
import { controlClient } from "../cli/ctl/client.ts";
import { type NodeJson, nodeJson } from "../cli/ctl/nodes.ts";
import { replicaJson } from "../cli/ctl/replicas.ts";
import { freePort, freePortBlock } from "../common/free-ports.ts";
import { processArgv, processRunning } from "../common/proc-fs.ts";
import { type Proc, runLlmgw, startLlmgw, waitForHttp } from "../common/processes.ts";
import { tempDir } from "../common/temp-dir.ts";
import type { ControlService } from "../proto/gen/control/v1/control_pb.ts";

/** A control plane on loopback with its own ports, config file and data dir. */
export interface ControlPlaneHandle {
  proc: Proc;
  dir: string;
  configPath: string;
  agentUrl: string;
  adminUrl: string;
  /** The admin token the control plane requires, when the test gave one. */
  adminToken: string | undefined;
  client: Client<typeof ControlService>;
  nodes(): Promise<NodeJson[]>;
  /** What `ctl replicas --json` prints, read in-process (no ctl process per poll). */
  replicas(): Promise<ReturnType<typeof replicaJson>[]>;
  /** `llmgw ctl ARGS` against this control plane, as an operator runs it (with the token in $LLMGW_ADMIN_TOKEN). */
  ctl(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }>;
  /** /metrics text (with the token, when there is one). */
  metrics(): Promise<string>;
  /** One sample of /metrics, e.g. `llmgw_agent_rejections_total{reason="name_in_use"}`; 0 when absent. */
  metric(series: string): Promise<number>;
  restart(): Promise<void>;
  /** The engine ports this control plane hands out (`control.port_range`, set for it alone). */
  enginePorts: [number, number];
}

export { tempDir };

export async function startControlPlane(
  configBody: string,
  opts: {
    dir?: string;
    env?: NodeJS.ProcessEnv;
    agentPort?: number;
    adminPort?: number;
    entry?: string;
    /** Require this admin token (passed as $LLMGW_ADMIN_TOKEN); none: an open admin API on loopback. */
    adminToken?: string;
  } = {},
): Promise<ControlPlaneHandle> {
  const dir = opts.dir ?? tempDir("cp");
  const agentPort = opts.agentPort ?? (await freePort());
  const adminPort = opts.adminPort ?? (await freePort());
  const configPath = join(dir, "llmgw.yaml");
  // Engine ports of their own, whatever the config says: two control
  // planes started at once (two test files) never hand out the same port.
  const engines = await freePortBlock(100);
  const portEnv = { LLMGW_CONTROL__PORT_RANGE: `[${engines[0]}, ${engines.at(-1)}]` };
  writeFileSync(
    configPath,
    `agent_listen: 127.0.0.1:${agentPort}\nadmin_listen: 127.0.0.1:${adminPort}\ndata_dir: ${join(dir, "data")}\n${configBody}`,
  );
  const adminUrl = `http://127.0.0.1:${adminPort}`;
  const tokenEnv = { LLMGW_ADMIN_TOKEN: opts.adminToken ?? "" };
  const launch = async () => {
    const p = startLlmgw(
      "control-plane",
      ["server", "--config", configPath],
      { ...portEnv, ...tokenEnv, ...opts.env },
      opts.entry,
    );
    await waitForHttp(p, `${adminUrl}/healthz`);
    return p;
  };
  const handle: ControlPlaneHandle = {
    proc: await launch(),
    dir,
    configPath,
    agentUrl: `http://127.0.0.1:${agentPort}`,
    adminUrl,
    adminToken: opts.adminToken,
    enginePorts: [engines[0]!, engines.at(-1)!],
    client: controlClient(adminUrl, opts.adminToken),
    async nodes() {
      const { nodes } = await handle.client.listNodes({});
      return nodes.map(nodeJson);
    },
    async replicas() {
      const { replicas } = await handle.client.listReplicas({});
      return replicas.map(replicaJson);
    },
    ctl: (...args) => runLlmgw(["ctl", ...args, "--control-plane", adminUrl], tokenEnv),
    async metrics() {
      const headers: Record<string, string> = opts.adminToken
        ? { authorization: `Bearer ${opts.adminToken}` }
        : {};
      return (await fetch(`${adminUrl}/metrics`, { headers })).text();
    },
    async metric(series) {
      const line = (await handle.metrics()).split("\n").find((l) => l.startsWith(`${series} `));
      return line ? Number(line.slice(series.length + 1)) : 0;
    },
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
  advertiseAddress?: string;
  /** Another llmgw to run, such as an installed one. */
  entry?: string;
}

/**
 * Each simulated node gets its own loopback address (127.0.0.2, .3, …), so
 * engines of different "nodes" on this one host can use the same port
 * numbers, exactly as engines on real nodes do.
 */
const loopbackOf = new Map<string, string>();
export function loopbackAddress(node: string): string {
  let a = loopbackOf.get(node);
  if (!a) {
    a = `127.0.0.${loopbackOf.size + 2}`;
    loopbackOf.set(node, a);
  }
  return a;
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
    o.advertiseAddress ?? loopbackAddress(node),
    "--state-dir",
    stateDir,
    ...Object.entries(o.fabric ?? {}).flatMap(([k, v]) => ["--fabric", `${k}=${v}`]),
    ...(o.extra ?? []),
  ];
  return startLlmgw(`agent-${node}`, args, {}, o.entry);
}

export { processArgv, processRunning };

/**
 * SIGKILLs the process group of every process whose command line contains
 * `needle` (e.g. a model source unique to one test run). Engines are
 * detached from their agents, so this is how a test makes sure none it
 * started outlives it, whatever state its agents' state files are in.
 */
export function killProcessesMatching(needle: string): number[] {
  const killed: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid < 2 || pid === process.pid) continue;
    const argv = processArgv(pid);
    if (!argv?.some((a) => a.includes(needle))) continue;
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        continue; // already gone
      }
    }
    killed.push(pid);
  }
  return killed;
}
