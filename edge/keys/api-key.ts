/**
 * A key as EdgeSync's ApiKey message and as the record the edge stores
 * (snake_case, as in KV): the one place the two spellings meet. `llmgw keys`
 * prints the same snake_case fields.
 */
import { formatDuration } from "../../common/duration.ts";
import type { ApiKey } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import type { KeyRecord } from "./rules.ts";

/** The fields an ApiKey and a key record share, in the record's spelling. */
export function recordFields(k: ApiKey) {
  return {
    id: k.id,
    name: k.name,
    tenant: k.tenant,
    max_band: k.maxBand,
    default_band: k.defaultBand,
    models: k.models,
    rpm: k.rpm,
    tpm: k.tpm,
    max_concurrent: k.maxConcurrent,
  };
}

/** A stored record as the ApiKey ListKeys answers with. */
export function apiKeyOf(k: KeyRecord) {
  return {
    id: k.id,
    hash: k.hash,
    name: k.name,
    tenant: k.tenant,
    maxBand: k.max_band,
    defaultBand: k.default_band,
    models: k.models,
    rpm: k.rpm,
    tpm: k.tpm,
    maxConcurrent: k.max_concurrent,
    budget:
      k.budget_tokens > 0
        ? { tokens: BigInt(k.budget_tokens), period: formatDuration(k.budget_period_ms) }
        : undefined,
    createdAtUnixMs: BigInt(k.created_at_unix_ms),
    expiresAtUnixMs: BigInt(k.expires_at_unix_ms),
    revoked: k.revoked,
  };
}
