import { resolve } from "node:path";
import { parseArgs } from "node:util";

/** Each site is a control plane, two agents and three engines or more: four keep a laptop usable. */
export const MAX_SITES = 4;

export const STACK_HELP = `usage: npm start [-- flags]

  --quiet              print no process logs: only progress, the banner and exits
  --state-dir DIR      where the stack keeps its state: edge KV, control plane data, agents'
                       engine state and logs (default .state; delete it for a clean start)
  --edge-port N        the edge's port (default 8787)
  --admin-port N       the control plane's admin API port (default 9090)
  --agent-port N       the control plane's agent listener port (default 7443)
  --engine-ports A-B   ports the control plane hands to engines (default: control.port_range in
                       infra/local/llmgw.yaml, 20000-20999)
  --sites N            N sites behind the one edge (1-${MAX_SITES}, default 1): each its own control plane
                       (site-a, site-b, …) with two agents and their engines, its state in
                       DIR/sites/SITE; site k's admin and agent ports are the flags' ports + k-1.
                       site-a holds the edge's EdgeSync token, the others their site's token
                       (docs/sites.md)
  -h, --help           this help
`;

export interface StackOptions {
  quiet: boolean;
  stateDir: string;
  edgePort: number;
  adminPort: number;
  agentPort: number;
  enginePorts: [number, number] | undefined;
  /** 1: the single, default site, exactly as before sites. */
  sites: number;
}

function port(value: string | undefined, flag: string, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > 65535)
    throw new Error(`${flag}: "${value}" is not a port (1-65535)`);
  return n;
}

function portRange(value: string | undefined): [number, number] | undefined {
  if (value === undefined) return undefined;
  const m = /^(\d+)-(\d+)$/.exec(value);
  const from = m ? port(m[1], "--engine-ports", 0) : 0;
  const to = m ? port(m[2], "--engine-ports", 0) : 0;
  if (!m || from > to) throw new Error(`--engine-ports: "${value}" is not a range FROM-TO, e.g. 20000-20999`);
  return [from, to];
}

function siteCount(value: string | undefined): number {
  if (value === undefined) return 1;
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > MAX_SITES)
    throw new Error(`--sites: "${value}" is not a number of sites from 1 to ${MAX_SITES}`);
  return n;
}

/** The flags after `npm start --`; `repo` anchors the default state directory. */
export function parseStackOptions(argv: string[], repo: string): StackOptions | "help" {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      quiet: { type: "boolean" },
      "state-dir": { type: "string" },
      "edge-port": { type: "string" },
      "admin-port": { type: "string" },
      "agent-port": { type: "string" },
      "engine-ports": { type: "string" },
      sites: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) return "help";
  const sites = siteCount(values.sites);
  for (const flag of ["admin-port", "agent-port"] as const) {
    const first = port(values[flag], `--${flag}`, 0);
    if (first + sites - 1 > 65535)
      throw new Error(`--${flag}: ${first} leaves no port for site ${sites} (${first + sites - 1} > 65535)`);
  }
  return {
    quiet: values.quiet ?? false,
    stateDir: resolve(repo, values["state-dir"] ?? ".state"),
    edgePort: port(values["edge-port"], "--edge-port", 8787),
    adminPort: port(values["admin-port"], "--admin-port", 9090),
    agentPort: port(values["agent-port"], "--agent-port", 7443),
    enginePorts: portRange(values["engine-ports"]),
    sites,
  };
}
