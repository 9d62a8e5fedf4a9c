import type { RateLimits, RateStanding } from "./rate-window.ts";

/**
 * A key's standing against its RPM and TPM as OpenAI sends it, so clients
 * and proxies that pace themselves on those headers (LiteLLM, LangChain's
 * rate limiters) work against llmgw unchanged:
 * `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets written
 * as OpenAI writes them (`20ms`, `1.5s`, `1m0s`).
 */
export function rateLimitHeaders(rate: RateLimits | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (rate?.requests) put(out, "requests", rate.requests);
  if (rate?.tokens) put(out, "tokens", rate.tokens);
  return out;
}

function put(out: Record<string, string>, what: "requests" | "tokens", s: RateStanding): void {
  out[`x-ratelimit-limit-${what}`] = String(s.limit);
  out[`x-ratelimit-remaining-${what}`] = String(s.remaining);
  out[`x-ratelimit-reset-${what}`] = resetText(s.resetMs);
}

/** A reset time as OpenAI writes one: whole milliseconds under a second, seconds (up to 3 decimals), minutes and seconds from one minute. */
export function resetText(ms: number): string {
  const whole = Math.max(0, Math.ceil(ms));
  if (whole < 1_000) return `${whole}ms`;
  if (whole < 60_000) return `${Number((whole / 1_000).toFixed(3))}s`;
  const minutes = Math.floor(whole / 60_000);
  return `${minutes}m${Number(((whole - minutes * 60_000) / 1_000).toFixed(3))}s`;
}
