import { z } from "zod";
import { MAX_EXPIRY_MS } from "../../common/key-expiry.ts";
import { ApiError, errors } from "../openai-errors.ts";

/**
 * An API key as stored at the edge (KV `keys/<sha256 hex>`). The secret
 * itself is never stored anywhere; only its hash is the lookup key.
 */
export const keyRecordSchema = z.object({
  id: z.string().min(1),
  hash: z.string().regex(/^[0-9a-f]{64}$/),
  name: z.string(),
  tenant: z.string().default(""),
  max_band: z.string().min(1),
  default_band: z.string().default(""),
  // Empty means every model the edge knows.
  models: z.array(z.string()).default([]),
  // 0 means unlimited.
  rpm: z.number().int().min(0).default(0),
  tpm: z.number().int().min(0).default(0),
  // Requests in flight at once; 0 means unlimited.
  max_concurrent: z.number().int().min(0).default(0),
  budget_tokens: z.number().int().min(0).default(0),
  budget_period_ms: z.number().int().min(0).default(0),
  created_at_unix_ms: z.number().int().default(0),
  // 0 means it never expires.
  expires_at_unix_ms: z.number().int().min(0).max(MAX_EXPIRY_MS).default(0),
  revoked: z.boolean().default(false),
});
export type KeyRecord = z.output<typeof keyRecordSchema>;

export interface Band {
  name: string;
  priority: number;
}

export interface KeyLimits {
  rpm: number;
  tpm: number;
  budgetTokens: number;
  budgetPeriodMs: number;
  /** Requests in flight at once; 0: no limit. */
  maxConcurrent: number;
}

export function limitsOf(key: KeyRecord): KeyLimits {
  return {
    rpm: key.rpm,
    tpm: key.tpm,
    budgetTokens: key.budget_tokens,
    budgetPeriodMs: key.budget_period_ms,
    maxConcurrent: key.max_concurrent,
  };
}

/**
 * The band a request runs in. A header may choose any band at or below the
 * key's highest band and never above it: priority is bought with the key,
 * not with a header. An unknown band name is the caller's mistake (400), a
 * known one above the key's ceiling is a permission problem (403); either
 * error names the header it came in (admission.band_header).
 */
export function resolveBand(
  key: KeyRecord,
  requested: { header: string; value: string } | null,
  bands: readonly Band[],
  fallbackDefault: string,
): Band {
  const byName = new Map(bands.map((b) => [b.name, b]));
  const ceiling = byName.get(key.max_band);
  if (!ceiling) {
    // Router settings changed under the key: the operator's to fix, and the
    // caller's to be told plainly rather than with a 500.
    throw errors.forbidden(
      `This key's highest band "${key.max_band}" is not one of this gateway's bands (${bands.map((b) => b.name).join(", ")}); ask its operator to update the key.`,
      "band_not_configured",
    );
  }
  if (requested !== null) {
    const wanted = byName.get(requested.value.trim().toLowerCase());
    if (!wanted) {
      throw new ApiError(
        400,
        `Unknown band; use one of: ${bands.map((b) => b.name).join(", ")}.`,
        "invalid_request_error",
        "invalid_band",
        requested.header,
      );
    }
    if (wanted.priority > ceiling.priority) {
      throw errors.forbidden(
        `This key may use bands up to "${ceiling.name}", not "${wanted.name}".`,
        "band_not_allowed",
        requested.header,
      );
    }
    return wanted;
  }
  const preferred = byName.get(key.default_band) ?? byName.get(fallbackDefault) ?? ceiling;
  // A default above the ceiling (e.g. a router default of gold for a bronze
  // key) is clamped rather than refused: the caller asked for nothing special.
  return preferred.priority > ceiling.priority ? ceiling : preferred;
}

/** A key that lists models may use those (by canonical name or by the alias it asked for). */
export function modelAllowed(key: KeyRecord, canonical: string, requested: string): boolean {
  return key.models.length === 0 || key.models.includes(canonical) || key.models.includes(requested);
}

/**
 * The requested model's chain (it, then its fallbacks) without the
 * fallbacks this key may not use: a key limited to X is never served by
 * X's fallback Y unless it may use Y too, by Y's name or one of its
 * aliases. The requested model itself was checked by `modelAllowed`.
 */
export function allowedChain(
  key: KeyRecord,
  chain: readonly string[],
  resolve: (name: string) => string | undefined,
): string[] {
  if (key.models.length === 0) return [...chain];
  const allowed = new Set(key.models.map((m) => resolve(m) ?? m));
  return chain.filter((m, i) => i === 0 || allowed.has(m));
}
