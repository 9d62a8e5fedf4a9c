import { DEFAULT_CONTROL_PLANE } from "../../cli/ctl/client.ts";
import { type StackSite, stackSitePreference } from "./sites.ts";

const DEFAULT_EDGE = "http://127.0.0.1:8787";

/** What `npm start` prints once the stack is up: how to call it and how to look around. */
export interface BannerFacts {
  edge: string;
  sites: readonly StackSite[];
  /** Each site's admin token, in the order of `sites`. */
  adminTokens: readonly string[];
  apiKey: string;
  edgeTokenFile: string;
  apiKeyFile: string;
  quiet: boolean;
}

const adminUrl = (s: StackSite) => `http://127.0.0.1:${s.adminPort}`;

export function banner(b: BannerFacts): string {
  const edgeFlag = b.edge === DEFAULT_EDGE ? "" : ` --edge ${b.edge}`;
  const call = `Call it:
  curl ${b.edge}/v1/chat/completions -H "Authorization: Bearer ${b.apiKey}" \\
    -H "Content-Type: application/json" \\
    -d '{"model":"llama-8b","messages":[{"role":"user","content":"Hello"}],"stream":true}'

  OPENAI_BASE_URL=${b.edge}/v1 OPENAI_API_KEY=${b.apiKey} node -e \\
    'new (require("openai").OpenAI)().chat.completions.create({model:"llama-8b",messages:[{role:"user",content:"Hi"}]}).then(r=>console.log(r.choices[0].message.content))'
`;
  const scale = `Watch qwen-32b scale from 1 to 4 replicas and back (about two minutes; ctl explain qwen-32b says why):
  export LLMGW_API_KEY=$(cat ${b.apiKeyFile})
  npx llmgw bench --url ${b.edge} --model qwen-32b --concurrency 16 --duration 60s
`;
  const tail = `${b.quiet ? "" : "Process logs follow (npm start -- --quiet hides them). "}Ctrl-C stops everything.\n`;
  const body = b.sites.length === 1 ? oneSite(b, edgeFlag) : severalSites(b, edgeFlag);
  return `\n\x1b[1mllmgw local stack is up\x1b[0m${body.head}\n${call}\n${body.look}\n${scale}\n${tail}`;
}

function oneSite(b: BannerFacts, edgeFlag: string): { head: string; look: string } {
  const site = b.sites[0]!;
  const admin = adminUrl(site);
  const ctlFlag = admin === DEFAULT_CONTROL_PLANE ? "" : ` --control-plane ${admin}`;
  return {
    head: `
  edge (OpenAI API)  ${b.edge}/v1
  control plane      admin ${admin}   agents http://127.0.0.1:${site.agentPort}
  dashboard          ${admin}/#token=${b.adminTokens[0]}
                     (the link signs in with the admin token; the fragment never reaches the server)
  API key            ${b.apiKey}
                     bands up to platinum; requests run as gold unless they send x-llmgw-band
`,
    look: `Look around (llmgw ctl needs the admin token, kept in ${site.adminTokenFile}):
  export LLMGW_ADMIN_TOKEN=$(cat ${site.adminTokenFile})
  npx llmgw ctl status${ctlFlag}   # one screen; also ctl nodes, ctl replicas, ctl models, ctl explain qwen-32b
  export LLMGW_EDGE_TOKEN=$(cat ${b.edgeTokenFile})   # the EdgeSync secret, kept like the admin token
  npx llmgw keys usage${edgeFlag}
  npx llmgw ctl endpoints status${edgeFlag}   # each model's pool: bands, queues, load
  curl -H "Authorization: Bearer $LLMGW_ADMIN_TOKEN" ${admin}/metrics
`,
  };
}

/** "EU → site-a, NA → site-b": each continent's nearest site. */
function nearest(sites: readonly StackSite[]): string {
  return Object.entries(stackSitePreference(sites).continents)
    .map(([c, order]) => `${c} → ${order[0]}`)
    .join(", ");
}

function severalSites(b: BannerFacts, edgeFlag: string): { head: string; look: string } {
  const rows = b.sites.map((s, i) => {
    const token = s.siteTokenFile
      ? `its own site token (${s.siteTokenFile}): writes only ${s.name}'s endpoints and load`
      : "the edge's token: also publishes the catalog and the router settings";
    return `  ${`site ${s.name}`.padEnd(19)}admin ${adminUrl(s)}   agents http://127.0.0.1:${s.agentPort}
                     dashboard ${adminUrl(s)}/#token=${b.adminTokens[i]}
                     EdgeSync with ${token}
`;
  });
  const ctl = b.sites.map(
    (s) => `  LLMGW_ADMIN_TOKEN=$(cat ${s.adminTokenFile}) npx llmgw ctl status --control-plane ${adminUrl(s)}
`,
  );
  return {
    head: `: ${b.sites.length} sites behind one edge (docs/sites.md)
  edge (OpenAI API)  ${b.edge}/v1
${rows.join("")}                     (each dashboard link signs in with its site's admin token)
  API key            ${b.apiKey}
                     one key for every site; bands up to platinum, gold unless a request sends x-llmgw-band
  Each answer's x-llmgw-endpoint header names the replica and its site (…/0@site-a); the model's pool
  at the edge routes over every site's replicas, nearest site first (router.sites: ${nearest(b.sites)}).
  Say where the client is with -H "x-llmgw-location: EU" (or NA, …): this local edge honours the header
  where Cloudflare would read request.cf. A request from EU goes to ${b.sites[0]!.name} while it can take it,
  one from NA to ${b.sites[1]!.name}; with no header, to whichever is least busy.
`,
    look: `Look around: each site's ctl needs its own admin token, kept in its directory. ctl status shows
the site's fleet, then every site's health and share of traffic at the edge (SITES):
${ctl.join("")}  export LLMGW_EDGE_TOKEN=$(cat ${b.edgeTokenFile})   # the edge's EdgeSync token
  npx llmgw keys usage${edgeFlag}
  npx llmgw ctl endpoints status${edgeFlag}   # each model's pool: its sites, bands, queues, load
`,
  };
}
