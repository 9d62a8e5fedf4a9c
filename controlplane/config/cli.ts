/**
 * `llmgw config check FILE` and `llmgw config schema`.
 *
 * `check` runs the same path the server does — YAML, defaults, LLMGW_
 * environment overrides, schema, catalog rules — and either lists every
 * problem (exit 1) or summarises what would actually run, so an operator sees
 * the effective replicas and GPU budget before deploying, not after.
 * `schema` prints the JSON Schema of the file's input side for editors
 * (yaml-language-server: `# yaml-language-server: $schema=llmgw.schema.json`).
 */
import { parseArgs } from "node:util";
import { z } from "zod";
import { formatDuration } from "../../common/duration.ts";
import { buildCatalog, type Catalog, CatalogError, type CatalogProfile } from "../catalog.ts";
import { portNeeds, portsPerNode } from "../placement/ports.ts";
import { ConfigError, type LoadedConfig, loadConfig } from "./load.ts";
import { type Config, configSchema } from "./schema.ts";

const USAGE = `usage:
  llmgw config check FILE [--print]   validate FILE (defaults + LLMGW_ env overrides applied) and summarise it
  llmgw config schema                 print the configuration's JSON Schema (for editors)
`;

export async function main(argv: string[]): Promise<number | undefined> {
  const [sub, ...rest] = argv;
  switch (sub) {
    case "check":
      return check(rest);
    case "schema":
      process.stdout.write(`${JSON.stringify(configJsonSchema(), null, 2)}\n`);
      return 0;
    case undefined:
    case "help":
    case "--help":
    case "-h":
      process.stdout.write(USAGE);
      return sub === undefined ? 2 : 0;
    default:
      process.stderr.write(`llmgw config: unknown subcommand "${sub}"\n\n${USAGE}`);
      return 2;
  }
}

/** The JSON Schema of what an operator writes (durations as strings, defaults optional). */
export function configJsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(configSchema, { io: "input", unrepresentable: "any" }) as Record<
    string,
    unknown
  >;
  return { ...schema, title: "llmgw configuration" };
}

function check(argv: string[]): number {
  const { values, positionals } = parseArgs({
    args: argv,
    options: { print: { type: "boolean", default: false } },
    allowPositionals: true,
  });
  const file = positionals[0];
  if (!file || positionals.length > 1) {
    process.stderr.write(USAGE);
    return 2;
  }
  const result = checkConfig(file, process.env);
  if (!result.ok) {
    process.stderr.write(
      `${file}: ${result.issues.length} problem${result.issues.length === 1 ? "" : "s"}\n`,
    );
    for (const i of result.issues) process.stderr.write(`  - ${i}\n`);
    return 1;
  }
  process.stdout.write(`${result.summary.join("\n")}\n`);
  if (values.print) process.stdout.write(`${JSON.stringify(result.loaded.config, null, 2)}\n`);
  return 0;
}

export type CheckResult =
  | { ok: true; loaded: LoadedConfig; catalog: Catalog; summary: string[] }
  | { ok: false; issues: string[] };

/** Loads and validates a file; never throws for a bad config, only for bugs. */
export function checkConfig(file: string, env: NodeJS.ProcessEnv): CheckResult {
  let loaded: LoadedConfig;
  try {
    loaded = loadConfig(file, env);
  } catch (err) {
    if (err instanceof ConfigError) return { ok: false, issues: err.issues };
    throw err;
  }
  try {
    const catalog = buildCatalog(loaded.config);
    return { ok: true, loaded, catalog, summary: summarise(loaded, catalog) };
  } catch (err) {
    if (err instanceof CatalogError) return { ok: false, issues: err.issues };
    throw err;
  }
}

const d = formatDuration;

function profileLine(p: CatalogProfile): string {
  const par = `tp${p.tensorParallel} × pp${p.pipelineParallel} × dp${p.dataParallel} = ${p.gpusPerReplica} GPU${p.gpusPerReplica === 1 ? "" : "s"}`;
  const layout = p.nodes > 1 ? `${p.nodes} nodes × ${p.gpusPerNode}, fabric ${p.fabric}` : "1 node";
  const gpu = [p.gpuModel, p.minMemoryMiB > 0 ? `>=${p.minMemoryMiB / 1024} GiB` : undefined]
    .filter(Boolean)
    .join(" ");
  const replicas =
    p.replicas.max > p.replicas.min ? `${p.replicas.min}..${p.replicas.max}` : `${p.replicas.min}`;
  return [
    `    profile ${p.name}: ${p.engine} ${p.source}`,
    `      ${par} (${layout})${gpu ? `, GPUs ${gpu}` : ""}, ${Math.round(p.memoryFraction * 100)}% VRAM`,
    `      replicas ${replicas}, ${p.strategy === "spread" ? "spread" : "bin-pack"}, ${portsPerNode(portNeeds(p))} port(s) per rank, startup deadline ${d(p.startupDeadlineMs)}`,
  ].join("\n");
}

export function summarise(loaded: LoadedConfig, catalog: Catalog): string[] {
  const c: Config = loaded.config;
  const lines: string[] = [`${loaded.source}: OK`];
  lines.push(
    loaded.envOverrides.length > 0
      ? `environment overrides applied: ${loaded.envOverrides.join(", ")}`
      : "environment overrides applied: none",
  );
  const ctl = c.control;
  lines.push(
    `control: interval ${d(ctl.interval)}, backoff ${d(ctl.base_backoff)} → ${d(ctl.max_backoff)}, unreachable after ${d(ctl.unreachable_after)}, lost after ${d(ctl.lost_after)}, ports ${ctl.port_range[0]}-${ctl.port_range[1]}, mgmt interface ${ctl.mgmt_interface}`,
  );
  const r = c.router;
  lines.push(
    `router: default routing ${r.default_routing}, retries ${r.retries}, breaker ${r.failure_threshold} failures / ${d(r.cooldown)}, timeouts response-header ${d(r.timeouts.response_header)} first-token ${d(r.timeouts.first_token)} total ${d(r.timeouts.total)}, streams committed at ${r.stream_commit === "headers" ? "the engine's headers" : "the first token"}, ${corsSummary(r.cors.allowed_origins)}`,
  );
  const a = r.admission;
  lines.push(
    `admission: ${a.enabled ? "on" : "off"}, bands ${a.bands.map((b) => `${b.name} ${b.saturation_ceiling}`).join(", ")}, default ${a.default_band}, queue ${a.queue_capacity_per_band}/band ttl ${d(a.queue_ttl)}, grants ${a.grants ? "on" : "off"}`,
  );
  lines.push(`listen: admin ${c.admin_listen}, agents ${c.agent_listen}; data dir ${c.data_dir}`);
  lines.push(`models (${catalog.models.length}):`);
  let replicas = 0;
  let gpus = 0;
  for (const m of catalog.models) {
    const extra = [
      m.aliases.length > 0 ? `aliases ${m.aliases.join(", ")}` : "",
      m.fallbacks.length > 0 ? `fallbacks ${m.fallbacks.join(" → ")}` : "",
      `routing ${m.routing}`,
    ].filter(Boolean);
    lines.push(`  ${m.name}: ${extra.join("; ")}`);
    if (m.routerOnly) {
      lines.push(
        `    router-only: ${m.endpoints.length} static endpoint(s)${m.endpoints.length ? ` (${m.endpoints.map((e) => e.id).join(", ")})` : ""}`,
      );
    }
    for (const p of m.profiles) {
      lines.push(profileLine(p));
      replicas += p.replicas.min;
      gpus += p.replicas.min * p.gpusPerReplica;
    }
  }
  lines.push(`desired: ${replicas} replica(s) on ${gpus} GPU(s); ${c.endpoints.length} static endpoint(s)`);
  lines.push(
    catalog.controlPlaneMode ? "mode: control plane (some model has profiles)" : "mode: router-only",
  );
  for (const w of catalog.warnings) lines.push(`warning: ${w}`);
  return lines;
}

function corsSummary(origins: readonly string[]): string {
  if (origins.includes("*")) return "web pages from any origin";
  return origins.length === 0 ? "no cross-origin web pages" : `web pages from ${origins.join(", ")}`;
}
