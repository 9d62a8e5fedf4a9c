import { join } from "node:path";
import type { StackOptions } from "./options.ts";

/**
 * The sites `npm start` runs (`--sites N`, docs/sites.md): each a control
 * plane with its own ports, state, admin token and agents. One site is the
 * default one, laid out as before sites, so an existing state directory
 * keeps working. With several, each is `site-a`, `site-b`, … under
 * `DIR/sites/NAME`; site-a holds the edge's EdgeSync token, because the
 * catalog (the models' aliases) and the router settings take it, and every
 * other site holds a token of its own that writes only its own endpoint
 * set and load.
 */
export interface StackSite {
  /** `site:` in its control plane's config; "default" for a stack of one site. */
  name: string;
  /** Before its processes' names in the log ("" for one site). */
  tag: string;
  adminPort: number;
  agentPort: number;
  adminTokenFile: string;
  dataDir: string;
  agentsDir: string;
  /** The file keeping its own site token; undefined: it holds the edge's token. */
  siteTokenFile: string | undefined;
  /** Its simulated GPU nodes, each on a loopback address of its own. */
  nodes: { name: string; address: string }[];
}

export function stackSites(opts: StackOptions): StackSite[] {
  if (opts.sites === 1) {
    return [
      {
        name: "default",
        tag: "",
        adminPort: opts.adminPort,
        agentPort: opts.agentPort,
        adminTokenFile: join(opts.stateDir, "admin.token"),
        dataDir: join(opts.stateDir, "controlplane"),
        agentsDir: join(opts.stateDir, "agents"),
        siteTokenFile: undefined,
        nodes: nodesAt(1),
      },
    ];
  }
  return Array.from({ length: opts.sites }, (_, k) => {
    const letter = String.fromCharCode(97 + k);
    const name = `site-${letter}`;
    const dir = join(opts.stateDir, "sites", name);
    return {
      name,
      tag: `${letter}/`,
      adminPort: opts.adminPort + k,
      agentPort: opts.agentPort + k,
      adminTokenFile: join(dir, "admin.token"),
      dataDir: join(dir, "controlplane"),
      agentsDir: join(dir, "agents"),
      siteTokenFile: k === 0 ? undefined : join(dir, "edge.token"),
      nodes: nodesAt(k + 1),
    };
  });
}

/**
 * Site k's nodes on 127.0.0.k1 and 127.0.0.k2: engines listen on their
 * node's address, so every site's engines may take the same ports, as
 * they would in two data centres.
 */
function nodesAt(k: number): { name: string; address: string }[] {
  return [1, 2].map((n) => ({ name: `gpu-node-${n}`, address: `127.0.0.${k * 10 + n}` }));
}

/** EDGE_SYNC_SITE_TOKENS, the edge's secret naming each site's token: the sites that hold one. */
export function siteTokensSecret(sites: readonly StackSite[], tokenOf: (s: StackSite) => string): string {
  const tokens: Record<string, string> = {};
  for (const s of sites) if (s.siteTokenFile) tokens[s.name] = tokenOf(s);
  return JSON.stringify(tokens);
}

/** Continents handed to the stack's sites in turn: the first site is nearest Europe, the second North America. */
const CONTINENTS = ["EU", "NA", "AS", "OC", "SA", "AF"] as const;

/**
 * The stack's `router.sites` (docs/sites.md, "Preference by location"):
 * each site nearest one continent (site-a EU, site-b NA, …), the others after
 * it in their order. Requests say where they come from with the
 * `x-llmgw-location` header, which the stack's edge honours
 * (LLMGW_LOCATION_HEADER); a request that sends none prefers no site.
 */
export function stackSitePreference(sites: readonly StackSite[]): { continents: Record<string, string[]> } {
  const names = sites.map((s) => s.name);
  const continents: Record<string, string[]> = {};
  names.slice(0, CONTINENTS.length).forEach((name, i) => {
    continents[CONTINENTS[i]!] = [name, ...names.filter((n) => n !== name)];
  });
  return { continents };
}
