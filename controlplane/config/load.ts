import { readFileSync } from "node:fs";
import { parseDocument, parse as parseYaml } from "yaml";
import { endpointIssueText, staticEndpointKeyIssues } from "../../common/static-endpoint.ts";
import { formatIssues } from "../../common/zod-issues.ts";
import { catalogIssues } from "../catalog.ts";
import { type Config, configSchema } from "./schema.ts";

/** A configuration that failed validation; each issue names its path. */
export class ConfigError extends Error {
  constructor(
    readonly source: string,
    readonly issues: string[],
  ) {
    super(`${source}: invalid configuration:\n${issues.map((i) => `  - ${i}`).join("\n")}`);
  }
}

const ENV_PREFIX = "LLMGW_";

/**
 * `LLMGW_CONTROL__LOST_AFTER=8s` sets `control.lost_after`. Values are read
 * as YAML scalars so numbers, booleans and `[20000, 20999]` keep their types;
 * an empty value unsets the key.
 * Only variables with a double underscore or a known top-level key are taken,
 * so unrelated LLMGW_ settings (LLMGW_EDGE_TOKEN, LLMGW_LOG_LEVEL) are not
 * mistaken for configuration.
 */
export function applyEnvOverrides(raw: Record<string, unknown>, env: NodeJS.ProcessEnv): string[] {
  const applied: string[] = [];
  const topKeys = new Set(Object.keys(configSchema.shape));
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith(ENV_PREFIX) || value === undefined) continue;
    const path = name.slice(ENV_PREFIX.length).toLowerCase().split("__");
    if (!topKeys.has(path[0]!)) continue;
    let node: Record<string, unknown> = raw;
    for (const key of path.slice(0, -1)) {
      const next = node[key];
      if (typeof next !== "object" || next === null || Array.isArray(next)) node[key] = {};
      node = node[key] as Record<string, unknown>;
    }
    // Empty unsets: the key falls back to its default, or to none
    // (LLMGW_EDGE__URL= turns the file's edge link off).
    if (value === "") {
      delete node[path.at(-1)!];
      applied.push(`${path.join(".")} (unset)`);
      continue;
    }
    let parsed: unknown;
    try {
      parsed = parseYaml(value);
    } catch {
      parsed = value;
    }
    node[path.at(-1)!] = parsed;
    applied.push(path.join("."));
  }
  return applied;
}

export interface LoadedConfig {
  config: Config;
  source: string;
  envOverrides: string[];
  /**
   * The `router:` section as written (file plus overrides, durations as
   * strings): what the control plane pushes to the edge, which owns its
   * schema and fills in the defaults itself.
   */
  routerSection: Record<string, unknown>;
}

/** Parses YAML text, overlays it on the defaults, then applies LLMGW_ overrides. */
export function parseConfig(text: string, source: string, env: NodeJS.ProcessEnv = {}): LoadedConfig {
  let raw: unknown = {};
  if (text.trim() !== "") {
    const doc = parseDocument(text);
    if (doc.errors.length > 0) {
      throw new ConfigError(
        source,
        doc.errors.map((e) => `YAML: ${e.message.split("\n")[0]}`),
      );
    }
    raw = doc.toJS() ?? {};
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw new ConfigError(source, ["(root): must be a mapping of keys to values"]);
  }
  const envOverrides = applyEnvOverrides(raw as Record<string, unknown>, env);
  const result = configSchema.safeParse(raw);
  if (!result.success)
    throw new ConfigError(source, [
      ...formatIssues(result.error),
      ...salvagedCatalogIssues(raw as Record<string, unknown>, result.error.issues),
    ]);
  // A key the control plane would push is checked where it is read: the
  // environment of this process (the file names the variable, never the key).
  const keyIssues = staticEndpointKeyIssues(result.data.endpoints, env);
  if (keyIssues.length > 0) throw new ConfigError(source, keyIssues.map(endpointIssueText));
  const router = (raw as Record<string, unknown>).router;
  const routerSection =
    typeof router === "object" && router !== null ? (router as Record<string, unknown>) : {};
  return { config: result.data, source, envOverrides, routerSection };
}

/**
 * The catalog's problems, found even though the schema refused the file: an
 * operator fixing one problem at a time would otherwise meet them only on the
 * next run. The top-level sections the schema refused are set aside (their
 * defaults stand in); with `models` itself refused there is nothing sound to
 * check, since the rules refer to models by their place in the list.
 */
function salvagedCatalogIssues(
  raw: Record<string, unknown>,
  issues: readonly { path: PropertyKey[] }[],
): string[] {
  const refused = new Set(issues.map((i) => String(i.path[0] ?? "")));
  if (refused.has("models") || refused.has("")) return [];
  const rest = Object.fromEntries(Object.entries(raw).filter(([k]) => !refused.has(k)));
  const salvaged = configSchema.safeParse(rest);
  return salvaged.success ? catalogIssues(salvaged.data) : [];
}

/** An empty or missing path runs on the defaults. */
export function loadConfig(path: string | undefined, env: NodeJS.ProcessEnv = process.env): LoadedConfig {
  if (!path) return parseConfig("", "(defaults)", env);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError(path, [`cannot read file: ${(err as Error).message}`]);
  }
  return parseConfig(text, path, env);
}

export function startupGraceMs(config: Config): number {
  return config.control.startup_grace ?? config.control.lost_after;
}
