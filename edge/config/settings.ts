/**
 * Where the router settings in force come from: the control plane's
 * `router:` section as stored in KV by PutRouterSettings, with the Worker's
 * `LLMGW_ROUTER` var (JSON, same keys) laid over it key by key — a local
 * override for development and tests, not a second home for the settings.
 * Both are raw (duration strings), so the overlay is merged before one
 * parse with routerSchema fills in the defaults.
 */
import { z } from "zod";
import { formatIssues } from "../../common/zod-issues.ts";
import { type RouterConfig, routerSchema } from "./router.ts";

export const routerDocSchema = z.object({
  version: z.number().int().min(0),
  settings: z.record(z.string(), z.unknown()),
});
export type RouterDoc = z.output<typeof routerDocSchema>;
export const EMPTY_ROUTER_DOC: RouterDoc = { version: 0, settings: {} };

export class SettingsError extends Error {}

type Raw = Record<string, unknown>;

const isObject = (v: unknown): v is Raw => typeof v === "object" && v !== null && !Array.isArray(v);

/** `over` laid on `base`: objects merge key by key, anything else replaces. */
export function overlay(base: Raw, over: Raw): Raw {
  const out: Raw = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const b = out[k];
    out[k] = isObject(b) && isObject(v) ? overlay(b, v) : v;
  }
  return out;
}

/** Validates a router section as the control plane sends it; throws SettingsError naming each bad path. */
export function parseRouterSection(raw: unknown): RouterConfig {
  const r = routerSchema.safeParse(raw);
  if (!r.success) throw new SettingsError(formatIssues(r.error).join("; "));
  return r.data;
}

function parseOverride(text: string | undefined): Raw {
  if (!text?.trim()) return {};
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new SettingsError(`LLMGW_ROUTER is not JSON: ${(err as Error).message}`);
  }
  if (!isObject(json)) throw new SettingsError("LLMGW_ROUTER must be a JSON object");
  return json;
}

/**
 * Keys an earlier edge accepted and this one refuses. A section stored in KV
 * before an upgrade, or an LLMGW_ROUTER written for the earlier edge, may
 * still hold one; read strictly, it would fail every request until the
 * control plane pushed again. So reading drops them, with a warning naming
 * each once per isolate; a push that sets one is still refused.
 */
const RETIRED: readonly (readonly [string, string])[] = [["timeouts", "dial"]];
const warnedRetired = new Set<string>();

function withoutRetired(raw: Raw): Raw {
  let out = raw;
  for (const [section, key] of RETIRED) {
    const inner = out[section];
    if (!isObject(inner) || !(key in inner)) continue;
    const { [key]: _dropped, ...rest } = inner;
    out = { ...out, [section]: rest };
    const path = `router.${section}.${key}`;
    if (!warnedRetired.has(path)) {
      warnedRetired.add(path);
      console.warn(`${path}: no longer supported, ignored; push the router section again without it`);
    }
  }
  return out;
}

let memo: { stored: Raw; override: string | undefined; value: RouterConfig } | undefined;

/** The settings in force: stored section, then the override, then defaults; retired keys dropped. */
export function resolveSettings(stored: Raw, override: string | undefined): RouterConfig {
  if (memo && memo.stored === stored && memo.override === override) return memo.value;
  const merged = withoutRetired(overlay(stored, parseOverride(override)));
  const r = routerSchema.safeParse(merged);
  if (!r.success) throw new SettingsError(`router settings are invalid: ${formatIssues(r.error).join("; ")}`);
  memo = { stored, override, value: r.data };
  return r.data;
}
