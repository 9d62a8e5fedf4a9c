/**
 * KV tokens of static endpoints (the config's `endpoints:`) whose entries do
 * not state them, learned from the engine's own `/metrics` as the agent
 * learns its engines' (common/engine-capacity.ts): one probe per endpoint
 * and url, a failed one retried on a doubling delay, and the figure handed
 * to the publisher's facts. A stated `capacity.kv_tokens` always wins and
 * is never probed. The batch (`max_num_seqs`) is not among vLLM's metrics,
 * so it stays what the entry states or the edge assumes (docs/routing.md).
 *
 * The decisions are pure (which endpoints to probe now and why, what the
 * edge is given); `StaticCapacity` is the shell that fetches and logs.
 */
import { doublingDelay } from "../common/backoff.ts";
import { kvTokensOf, VLLM_CACHE_CONFIG_INFO } from "../common/engine-capacity.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import { fetchMetricsText } from "../common/metrics-fetch.ts";
import { parsePrometheusText } from "../common/prometheus-text.ts";
import type { EndpointConfig } from "./config/schema.ts";

/** What is known of one endpoint's KV tokens, for the url it was probed at. */
export type Probe =
  | { url: string; state: "probing"; failures: number }
  | { url: string; state: "learned"; kvTokens: number }
  /** Reachable, but no cache-config info (an SGLang engine, another server): a retry would read the same. */
  | { url: string; state: "absent" }
  | { url: string; state: "failed"; failures: number; at: number };

export type ProbeReason = "new endpoint" | "url changed" | "retry";

export interface RetryPolicy {
  baseMs: number;
  maxMs: number;
}

/** 5 s, 10 s, … up to a minute: a static engine started after the control plane is learned soon, a dark one costs a GET a minute. */
export const DEFAULT_RETRY: RetryPolicy = { baseMs: 5_000, maxMs: 60_000 };

/** Pure: the endpoints to probe now, each with why; endpoints that state their KV tokens never are. */
export function probesDue(
  endpoints: readonly EndpointConfig[],
  probes: ReadonlyMap<string, Probe>,
  now: number,
  retry: RetryPolicy,
): { endpoint: EndpointConfig; why: ProbeReason }[] {
  const due: { endpoint: EndpointConfig; why: ProbeReason }[] = [];
  for (const endpoint of endpoints) {
    if (endpoint.capacity?.kv_tokens !== undefined) continue;
    const p = probes.get(endpoint.id);
    if (!p) due.push({ endpoint, why: "new endpoint" });
    else if (p.url !== endpoint.url) due.push({ endpoint, why: "url changed" });
    else if (p.state === "failed" && now - p.at >= doublingDelay(p.failures, retry.baseMs, retry.maxMs))
      due.push({ endpoint, why: "retry" });
  }
  return due;
}

/** Pure: the endpoints as the edge is given them, a learned figure filled in where the entry states none. */
export function withLearnedCapacity(
  endpoints: readonly EndpointConfig[],
  probes: ReadonlyMap<string, Probe>,
): EndpointConfig[] {
  return endpoints.map((e) => {
    const p = probes.get(e.id);
    if (e.capacity?.kv_tokens !== undefined || p?.state !== "learned" || p.url !== e.url) return e;
    return { ...e, capacity: { ...e.capacity, kv_tokens: p.kvTokens } };
  });
}

/** The engine's /metrics beside its API: the endpoint's url may end in /v1, vLLM's metrics sit at the root. */
export function metricsUrl(base: string): string {
  return `${base.replace(/\/+$/, "").replace(/\/v1$/, "")}/metrics`;
}

/** Pure: the KV tokens a /metrics text states; 0 when it has no cache-config info. */
export function kvTokensInMetrics(text: string): number {
  return kvTokensOf(parsePrometheusText(text, (n) => n === VLLM_CACHE_CONFIG_INFO).samples);
}

export interface StaticCapacityOptions {
  log: Logger;
  /** Per probe, read at each (the config's `router.scrape_timeout`, which a reload may change). */
  timeoutMs: () => number;
  now: () => number;
  retry?: RetryPolicy;
  fetchText?: (url: string, timeoutMs: number) => Promise<string>;
}

export class StaticCapacity {
  private readonly probes = new Map<string, Probe>();

  constructor(private readonly opts: StaticCapacityOptions) {}

  /**
   * The endpoints with what has been learned so far; starts the probes now
   * due, whose figures show in a later call. Called with every look at the
   * facts, so an endpoint added or moved by a reload is probed at once.
   */
  apply(endpoints: readonly EndpointConfig[]): EndpointConfig[] {
    const ids = new Set(endpoints.map((e) => e.id));
    for (const id of this.probes.keys()) if (!ids.has(id)) this.probes.delete(id);
    const due = probesDue(endpoints, this.probes, this.opts.now(), this.opts.retry ?? DEFAULT_RETRY);
    for (const { endpoint, why } of due) void this.probe(endpoint, why);
    return withLearnedCapacity(endpoints, this.probes);
  }

  private async probe(e: EndpointConfig, why: ProbeReason): Promise<void> {
    const before = this.probes.get(e.id);
    const failures = before?.url === e.url && before.state === "failed" ? before.failures : 0;
    this.probes.set(e.id, { url: e.url, state: "probing", failures });
    const url = metricsUrl(e.url);
    const fields = { endpoint: e.id, url };
    const fetchText = this.opts.fetchText ?? fetchMetricsText;
    let kvTokens: number;
    try {
      kvTokens = kvTokensInMetrics(await fetchText(url, this.opts.timeoutMs()));
    } catch (err) {
      if (!this.current(e)) return;
      this.probes.set(e.id, { url: e.url, state: "failed", failures: failures + 1, at: this.opts.now() });
      // Once per endpoint and url: a dark endpoint is retried every minute
      // for as long as it stays dark, and says so only the first time.
      if (failures === 0)
        this.opts.log.warn(
          "static endpoint's /metrics unreachable: its KV tokens stay unknown while it is retried (state capacity.kv_tokens to skip the probe)",
          { ...fields, error: errorMessage(err) },
        );
      return;
    }
    if (!this.current(e)) return;
    if (kvTokens > 0) {
      this.probes.set(e.id, { url: e.url, state: "learned", kvTokens });
      this.opts.log.info("KV tokens of a static endpoint learned from its /metrics", {
        ...fields,
        kv_tokens: kvTokens,
        why,
        ...(failures > 0 ? { afterFailures: failures } : {}),
      });
    } else {
      this.probes.set(e.id, { url: e.url, state: "absent" });
      this.opts.log.warn(
        `static endpoint's /metrics has no ${VLLM_CACHE_CONFIG_INFO}: its KV tokens stay unknown (state capacity.kv_tokens)`,
        fields,
      );
    }
  }

  /** A probe's answer counts only while the endpoint is still there at the url it was asked at. */
  private current(e: EndpointConfig): boolean {
    const p = this.probes.get(e.id);
    return p?.state === "probing" && p.url === e.url;
  }
}
