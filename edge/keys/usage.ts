import { formatDuration } from "../../common/duration.ts";
import type { Env } from "../env.ts";
import { type ApiError, errors } from "../openai-errors.ts";
import type { Outcome } from "../proxy/proxy.ts";
import { type ChargeInput, sumCharges } from "./charge.ts";
import { ChargeBatcher } from "./charge-batcher.ts";
import { rateLimitHeaders } from "./rate-limit-headers.ts";
import type { AdmitRefusal } from "./rate-window.ts";
import type { ReservationRequest } from "./reservations.ts";
import { type KeyRecord, limitsOf } from "./rules.ts";

/**
 * A key's limits before a request and its charge after: the two places a
 * request meets its KeyLedger. Keys without limits skip the ledger at
 * admission (a round trip on every request); their usage is still charged,
 * and revocation reaches them through the RevocationLog.
 */
function ledgerOf(env: Env, keyId: string) {
  return env.KEY_LEDGER.get(env.KEY_LEDGER.idFromName(keyId));
}

function hasLimits(key: KeyRecord): boolean {
  return (
    key.rpm > 0 ||
    key.tpm > 0 ||
    (key.budget_tokens > 0 && key.budget_period_ms > 0) ||
    key.max_concurrent > 0
  );
}

/**
 * Refuses the request if the key is revoked, over RPM/TPM, out of budget,
 * or if its running requests may spend what is left; otherwise the ledger
 * holds `reservation` until the request's charge closes it. Either way, a
 * key with RPM or TPM learns where it stands: the `x-ratelimit-*` headers
 * its answer carries (on a refusal, the error's).
 */
export async function admitKey(
  env: Env,
  key: KeyRecord,
  reservation: ReservationRequest,
): Promise<Record<string, string>> {
  if (!hasLimits(key)) return {};
  const adm = await ledgerOf(env, key.id).admit(limitsOf(key), reservation);
  const headers = rateLimitHeaders(adm.rate);
  if (!adm.ok) {
    const err = refusal(adm, key.budget_period_ms);
    Object.assign(err.headers, headers);
    throw err;
  }
  return headers;
}

/** A key ledger's refusal (rate-window.ts) as the error the client gets. */
export function refusal(r: AdmitRefusal, budgetPeriodMs: number): ApiError {
  const period = formatDuration(budgetPeriodMs);
  switch (r.reason) {
    case "revoked":
      return errors.unauthorized("This API key has been revoked.");
    case "budget":
      return errors.quotaExhausted(
        `You exceeded this key's token budget (${r.limit} tokens per ${period}); Retry-After says when the next period begins.`,
        r.retryAfterMs,
      );
    case "pending":
      return r.of === "budget"
        ? errors.rateLimited(
            `This key's requests still running may use the rest of its token budget (${r.limit} tokens per ${period}); retry once they have finished.`,
            "budget_pending",
            r.retryAfterMs,
          )
        : errors.rateLimited(
            `This key's requests still running may reach its limit of ${r.limit} tokens per minute; retry once they have finished.`,
            "rate_limit_exceeded",
            r.retryAfterMs,
          );
    case "concurrency":
      return errors.rateLimited(
        `This key already has ${r.limit} requests in flight, its limit; retry once one has finished.`,
        "concurrency_limit",
        r.retryAfterMs,
      );
    default:
      return errors.rateLimited(
        `Rate limit reached: ${r.limit} ${r.reason === "rpm" ? "requests" : "tokens"} per minute.`,
        "rate_limit_exceeded",
        r.retryAfterMs,
      );
  }
}

interface PendingCharge {
  env: Env;
  charge: ChargeInput;
  periodMs: number;
}

async function flushCharges(keyId: string, items: PendingCharge[], batchId: string): Promise<void> {
  const first = items[0]!;
  await ledgerOf(first.env, keyId).charge(
    sumCharges(
      batchId,
      items.map((i) => i.charge),
    ),
    first.periodMs,
  );
}

// Keys with RPM, TPM or a budget are charged within milliseconds, so the
// next admission sees the tokens just used. Keys without limits only feed
// usage totals: their charges gather for a second, one ledger call per key
// per second per isolate instead of one per burst of requests.
const limitedCharges = new ChargeBatcher<PendingCharge>(flushCharges, 10);
const unlimitedCharges = new ChargeBatcher<PendingCharge>(flushCharges, 1_000);

/** Charges what the request used, once: every admitted request, failed ones for 0 tokens. */
export function charge(env: Env, key: KeyRecord, requestId: string, o: Outcome | undefined): Promise<void> {
  return (hasLimits(key) ? limitedCharges : unlimitedCharges).add(key.id, {
    env,
    periodMs: key.budget_period_ms,
    charge: {
      prompt_tokens: o?.usage?.prompt_tokens ?? 0,
      completion_tokens: o?.usage?.completion_tokens ?? 0,
      partial: o !== undefined && !o.completed && o.status < 400,
      estimated: o?.usageEstimated === true,
      reservation: hasLimits(key) ? requestId : undefined,
    },
  });
}
