import { readFileSync } from "node:fs";
import { create, toJsonString } from "@bufbuild/protobuf";
import { parseDocument } from "yaml";
import { z } from "zod";
import { DEFAULT_EDGE, edgeSyncClient, edgeUrl } from "../../common/edgesync-client.ts";
import { errorMessage } from "../../common/log.ts";
import {
  type EnvLookup,
  endpointIssueText,
  staticEndpointIn,
  staticEndpointKeyIssues,
  staticEndpointListIssues,
  staticEndpointSchema,
} from "../../common/static-endpoint.ts";
import { formatIssues } from "../../common/zod-issues.ts";
import { GetPoolStatusResponseSchema, type PoolStatus } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { EDGE_FLAGS, failure, openCommand } from "./command.ts";
import { shareText, siteRows } from "./sites.ts";
import { renderTable } from "./table.ts";

/**
 * `llmgw ctl endpoints set FILE`: router-only mode. A YAML list of engines
 * (id, url, models, pool (the spill group), weight, priority, optionally via, capacity,
 * served_model_name and api_key_env) is validated
 * here with path-named errors and written straight to the edge, with no
 * control plane involved — how a user points llmgw at engines they run by
 * hand.
 */
export const endpointsFileSchema = z.array(staticEndpointSchema).superRefine((list, ctx) => {
  for (const i of staticEndpointListIssues(list)) {
    ctx.addIssue({ code: "custom", path: [i.index, i.field], message: i.message });
  }
});
export type EndpointsFile = z.output<typeof endpointsFileSchema>;

/**
 * Parses and validates the file; throws one message listing every problem
 * by path. With `env`, each `api_key_env` must name a variable set there
 * (the keys this process would push).
 */
export function parseEndpointsFile(text: string, source: string, env?: EnvLookup): EndpointsFile {
  const doc = parseDocument(text);
  if (doc.errors.length > 0) throw new Error(`${source}: ${doc.errors.map((e) => e.message).join("; ")}`);
  let raw = doc.toJS() as unknown;
  // Either a bare list or `endpoints: [...]`, the same key as the config file.
  if (raw && typeof raw === "object" && !Array.isArray(raw) && "endpoints" in raw) {
    raw = (raw as { endpoints: unknown }).endpoints;
  }
  const r = endpointsFileSchema.safeParse(raw ?? []);
  if (!r.success) {
    throw invalidFile(
      source,
      formatIssues(r.error).map((i) => (i.startsWith("[") ? `endpoints${i}` : i)),
    );
  }
  const keys = env ? staticEndpointKeyIssues(r.data, env) : [];
  if (keys.length > 0) {
    throw invalidFile(source, keys.map(endpointIssueText));
  }
  return r.data;
}

function invalidFile(source: string, issues: string[]): Error {
  return new Error(`${source}: invalid endpoints:\n${issues.map((i) => `  - ${i}`).join("\n")}`);
}

const HELP = `usage: llmgw ctl endpoints set FILE [--edge URL] [--version N] [--allow-empty] [--site SITE]
       llmgw ctl endpoints check FILE
       llmgw ctl endpoints status [MODEL] [--edge URL] [--json]

FILE is a YAML list of endpoints: id, url, models, pool (its spill group), weight,
priority (the spill group's), via,
capacity (max_num_seqs, kv_tokens: what the engine can hold),
served_model_name (the name sent to that engine, if not the catalog's) and
api_key_env (the variable holding the key the engine requires, its --api-key:
read from this command's environment, set and check alike; never the key in the file).
An empty list replaces the edge's endpoints only with --allow-empty: it stops
every request to them. --site writes that site's set (docs/sites.md); without
it, the default site's, or the own site of a site's token.
status shows what each model's pool at the edge holds now: saturation, the
band queues, and per endpoint its load, requests in flight and breaker.
--edge defaults to $LLMGW_EDGE_URL, else ${DEFAULT_EDGE}; the EdgeSync secret is read
from $LLMGW_EDGE_TOKEN.
`;

export async function main(argv: string[]): Promise<number | undefined> {
  const opened = openCommand(argv, HELP, {
    ...EDGE_FLAGS,
    version: { type: "string" },
    "allow-empty": { type: "boolean" },
    site: { type: "string" },
  });
  if (typeof opened === "number") return opened;
  const { command, values, positionals } = opened;
  const edge = edgeUrl(values.edge);
  if (command === "status") return status(edge, positionals[0] ?? "", values.json === true);
  const file = positionals[0];
  if ((command !== "set" && command !== "check") || !file) {
    process.stderr.write(HELP);
    return 2;
  }
  let endpoints: EndpointsFile;
  try {
    endpoints = parseEndpointsFile(readFileSync(file, "utf8"), file, process.env);
  } catch (err) {
    process.stderr.write(`${errorMessage(err)}\n`);
    return 1;
  }
  if (command === "check") {
    process.stdout.write(`${file}: ${endpoints.length} endpoints OK\n`);
    return 0;
  }
  if (values.version !== undefined && !/^\d{1,18}$/.test(values.version)) {
    process.stderr.write(
      `llmgw: --version: "${values.version}" is not a whole number of at most 18 digits\n`,
    );
    return 2;
  }
  try {
    const res = await edgeSyncClient(edge).putEndpointSets({
      endpoints: endpoints.map(staticEndpointIn(process.env)),
      version: values.version ? BigInt(values.version) : 0n,
      allowEmpty: values["allow-empty"] === true,
      site: values.site ?? "",
    });
    const site = values.site ? ` site ${values.site}` : "";
    process.stdout.write(`wrote ${endpoints.length} endpoints to ${edge}${site} (version ${res.version})\n`);
    return 0;
  } catch (err) {
    process.stderr.write(`llmgw ctl endpoints set: ${failure(err)} (edge ${edge})\n`);
    return 1;
  }
}

async function status(edge: string, model: string, json: boolean): Promise<number> {
  let pools: PoolStatus[];
  try {
    pools = (await edgeSyncClient(edge).getPoolStatus({ model })).pools;
  } catch (err) {
    process.stderr.write(`llmgw ctl endpoints status: ${failure(err)} (edge ${edge})\n`);
    return 1;
  }
  if (json) {
    process.stdout.write(
      `${toJsonString(GetPoolStatusResponseSchema, create(GetPoolStatusResponseSchema, { pools }), { prettySpaces: 2 })}\n`,
    );
    return 0;
  }
  process.stdout.write(formatPools(pools));
  return 0;
}

const num = (v: number, digits = 2) => (v < 0 ? "-" : v.toFixed(digits));

/** What the pool counts the endpoint's charges against; "assumed" where nobody said (docs/routing.md). */
function capacity(seqs: number, kvTokens: bigint): string {
  const s = seqs > 0 ? `${seqs} seqs` : "seqs assumed";
  return kvTokens > 0n ? `${s}, ${Number(kvTokens).toLocaleString("en-US")} tokens` : s;
}

/** How many calls the pool took and how many per admission: what coalescing folded together. */
function poolCalls(p: PoolStatus): string {
  if (p.calls === 0n) return "";
  const admitted = p.bands.reduce((n, b) => n + b.admitted, 0n);
  const per = admitted > 0n ? ` (${(Number(p.calls) / Number(admitted)).toFixed(2)} per admission)` : "";
  return `, ${p.calls} pool calls${per}`;
}

/**
 * What became of the pool's grants (docs/routing.md, "Grants"): requests
 * admitted in their isolates without a call. Nothing while none was issued.
 */
function grantsLine(p: PoolStatus): string {
  const g = p.grants;
  if (!g || g.issued === 0n) return "";
  const late = g.late > 0n ? ` (${g.late} told late)` : "";
  return `  grants: ${g.outstanding} set aside now; ${g.issued} issued, ${g.used + g.late} used${late}, ${g.returned} given back, ${g.expired} expired\n`;
}

/** A pool's sites and each one's requests routed; nothing for a single-site edge, which prints as it did before sites. */
function siteLines(p: PoolStatus): string {
  if (!p.sites.some((s) => s.site !== "default")) return "";
  const sites = p.sites.map(
    (s) => `${s.site} v${s.version} (${s.endpoints} endpoints, load feed ${s.loadFeed})`,
  );
  const shares = siteRows([p]).map(
    (r) => `${r.site} ${r.routed} (${r.routedLastMinute} in the last minute, ${shareText(r.share)})`,
  );
  return `  sites: ${sites.join(", ")}\n  routed to: ${shares.join(", ")}\n`;
}

/** Why the last decision passed endpoints over (the site stage says which site and why); nothing if it passed none. */
function setAsideLine(p: PoolStatus): string {
  const aside = new Map<string, string[]>();
  for (const r of p.lastRejections) {
    const why = `${r.stage}: ${r.reason}`;
    aside.set(why, [...(aside.get(why) ?? []), r.endpoint]);
  }
  if (aside.size === 0) return "";
  return `  last decision set aside: ${[...aside].map(([why, eps]) => `${eps.join(", ")} (${why})`).join("; ")}\n`;
}

/** Requests in flight, and of those the streams still prefilling, and the grants' slots set aside beside them. */
function inflightCell(e: PoolStatus["endpoints"][number]): string {
  const notes = [
    ...(e.prefilling > 0 ? [`${e.prefilling} prefilling`] : []),
    ...(e.reserved > 0 ? [`+${e.reserved} granted`] : []),
  ];
  return notes.length > 0 ? `${e.inflight} (${notes.join(", ")})` : String(e.inflight);
}

/** One block per model: its pool's state, its bands, its endpoints. */
export function formatPools(pools: readonly PoolStatus[]): string {
  const out: string[] = [];
  for (const p of pools) {
    if (p.error) {
      out.push(`${p.model}: pool unreachable: ${p.error}\n`);
      continue;
    }
    const routes = Object.entries(p.routes)
      .filter(([, v]) => v > 0n)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    out.push(
      `${p.model}: saturation ${num(p.saturation)}, load feed ${p.loadFeed}, ${p.leases} in flight, ${p.sessions} sessions, endpoint set v${p.endpointsVersion}` +
        `${p.failOpens > 0n ? `, ${p.failOpens} fail-open` : ""}${poolCalls(p)}\n  decided by: ${routes || "-"}\n`,
    );
    out.push(grantsLine(p), siteLines(p), setAsideLine(p));
    out.push(
      renderTable(
        [
          "band",
          "ceiling",
          "queued now",
          "admitted",
          "queued",
          "full (429)",
          "expired (503)",
          "left",
          "no endpoints (503)",
          "no capacity (503)",
        ],
        p.bands.map((b) => [
          b.name,
          num(b.ceiling),
          String(b.depth),
          String(b.admitted),
          String(b.queued),
          String(b.full),
          String(b.expired),
          String(b.abandoned),
          String(b.noEndpoints),
          String(b.noCapacity),
        ]),
      ),
    );
    out.push(
      renderTable(
        [
          "endpoint",
          "pool",
          "prio",
          "state",
          "in flight",
          "saturation",
          "breaker",
          "waiting",
          "running",
          "kv",
          "load age",
          "capacity",
          "charged",
        ],
        p.endpoints.map((e) => [
          e.id,
          e.pool,
          String(e.priority),
          e.state,
          inflightCell(e),
          num(e.saturation),
          e.breakerReason ? `${e.breaker} (${e.breakerReason.slice(0, 80)})` : e.breaker,
          e.loadAgeMs < 0n ? "-" : String(e.waiting),
          e.loadAgeMs < 0n ? "-" : String(e.running),
          e.loadAgeMs < 0n ? "-" : num(e.kvUsage),
          e.loadAgeMs < 0n ? "never" : `${(Number(e.loadAgeMs) / 1000).toFixed(1)}s`,
          capacity(e.maxNumSeqs, e.kvTokens),
          `${Number(e.tokens).toLocaleString("en-US")} tokens`,
        ]),
      ),
    );
    out.push("\n");
  }
  return out.join("");
}
