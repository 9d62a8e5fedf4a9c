import { type RouterConfig, routerSchema } from "../controlplane/config/schema.ts";

/**
 * Router settings come from the `LLMGW_ROUTER` var (JSON, same keys as the
 * `router:` section of the config file) so the defaults live in one place,
 * routerSchema, and tests can shorten timeouts without a second code path.
 * Parsed once per isolate per distinct value.
 */
let cached: { raw: string; value: RouterConfig } | undefined;

export function routerSettings(raw: string | undefined): RouterConfig {
  const text = raw?.trim() ? raw : "{}";
  if (cached?.raw === text) return cached.value;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new Error(`LLMGW_ROUTER is not JSON: ${(err as Error).message}`);
  }
  const parsed = routerSchema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`);
    throw new Error(`LLMGW_ROUTER is invalid: ${issues.join("; ")}`);
  }
  cached = { raw: text, value: parsed.data };
  return parsed.data;
}
