/**
 * The capacity of static endpoints (the config's `endpoints:`) whose entries
 * do not state it, learned from the engine itself as the agent learns its
 * engines' (common/engine-capacity.ts): KV tokens from its `/metrics`
 * (vLLM's cache-config info, SGLang's pool gauge) and, where those are
 * SGLang's, the batch from its server info (common/sglang-server-info.ts).
 * One probe per endpoint and url, a failed one retried on a doubling delay,
 * the figures handed to the publisher's facts. A stated figure always wins;
 * an entry that states both is never probed. vLLM's batch is in none of its
 * answers, so it stays what the entry states or the edge assumes
 * (docs/routing.md).
 *
 * The decisions are pure (which endpoints to probe now and why, what the
 * edge is given); `StaticCapacity` is the shell that fetches and logs.
 */

import { doublingDelay } from "../common/backoff.ts";
import { KV_CAPACITY_SOURCES, kvCapacityOfAny } from "../common/engine-capacity.ts";
import { fetchEngineJson, fetchFirstJson, fetchMetricsText } from "../common/engine-fetch.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import { parsePrometheusText } from "../common/prometheus-text.ts";
import {
  capacityFromServerInfo,
  type EngineCapacity,
  SGLANG_SERVER_INFO_PATHS,
} from "../common/sglang-server-info.ts";
import { type EnvLookup, staticEndpointKey } from "../common/static-endpoint.ts";
import type { EndpointConfig } from "./config/schema.ts";

/** What is known of one endpoint's capacity, for the url it was probed at. */
export type Probe =
  | { url: string; state: "probing"; failures: number }
  /** At least one figure the entry does not state. */
  | { url: string; state: "learned"; capacity: EngineCapacity }
  /** Reachable, but it states nothing the entry lacks (another server, vLLM's batch): a retry would read the same. */
  | { url: string; state: "absent" }
  | { url: string; state: "failed"; failures: number; at: number };

export type ProbeReason = "new endpoint" | "url changed" | "retry";

export interface RetryPolicy {
  baseMs: number;
  maxMs: number;
}

/** 5 s, 10 s, … up to a minute: a static engine started after the control plane is learned soon, a dark one costs a GET a minute. */
export const DEFAULT_RETRY: RetryPolicy = { baseMs: 5_000, maxMs: 60_000 };

const statesAll = (e: EndpointConfig) =>
  e.capacity?.kv_tokens !== undefined && e.capacity?.max_num_seqs !== undefined;

/** Pure: the endpoints to probe now, each with why; endpoints that state their whole capacity never are. */
export function probesDue(
  endpoints: readonly EndpointConfig[],
  probes: ReadonlyMap<string, Probe>,
  now: number,
  retry: RetryPolicy,
): { endpoint: EndpointConfig; why: ProbeReason }[] {
  const due: { endpoint: EndpointConfig; why: ProbeReason }[] = [];
  for (const endpoint of endpoints) {
    if (statesAll(endpoint)) continue;
    const p = probes.get(endpoint.id);
    if (!p) due.push({ endpoint, why: "new endpoint" });
    else if (p.url !== endpoint.url) due.push({ endpoint, why: "url changed" });
    else if (p.state === "failed" && now - p.at >= doublingDelay(p.failures, retry.baseMs, retry.maxMs))
      due.push({ endpoint, why: "retry" });
  }
  return due;
}

/** Pure: the endpoints as the edge is given them, each learned figure filled in where the entry states none. */
export function withLearnedCapacity(
  endpoints: readonly EndpointConfig[],
  probes: ReadonlyMap<string, Probe>,
): EndpointConfig[] {
  return endpoints.map((e) => {
    const p = probes.get(e.id);
    if (p?.state !== "learned" || p.url !== e.url) return e;
    const learned = {
      ...(p.capacity.kvTokens !== undefined ? { kv_tokens: p.capacity.kvTokens } : {}),
      ...(p.capacity.maxNumSeqs !== undefined ? { max_num_seqs: p.capacity.maxNumSeqs } : {}),
    };
    return { ...e, capacity: { ...learned, ...e.capacity } };
  });
}

/** The engine's root, where vLLM and SGLang serve /metrics and SGLang its server info: the url may end in /v1. */
export function engineRoot(base: string): string {
  return base.replace(/\/+$/, "").replace(/\/v1$/, "");
}

export function metricsUrl(base: string): string {
  return `${engineRoot(base)}/metrics`;
}

/** What a /metrics text says of capacity: its KV tokens (0: none) and whether the engine is SGLang's, whose server info says more. */
export function capacityInMetrics(text: string): { kvTokens: number; sglang: boolean } {
  const kvNames = new Set(KV_CAPACITY_SOURCES.map((s) => s.name));
  let sglang = false;
  const { samples } = parsePrometheusText(text, (n) => {
    if (n.startsWith("sglang:")) sglang = true;
    return kvNames.has(n);
  });
  return { kvTokens: kvCapacityOfAny(samples), sglang };
}

/** Pure: what a probe learned for `e`, only figures its entry lacks; empty when none. */
export function learnedFor(e: EndpointConfig, found: EngineCapacity): EngineCapacity {
  return {
    ...(e.capacity?.kv_tokens === undefined && found.kvTokens ? { kvTokens: found.kvTokens } : {}),
    ...(e.capacity?.max_num_seqs === undefined && found.maxNumSeqs ? { maxNumSeqs: found.maxNumSeqs } : {}),
  };
}

export interface StaticCapacityOptions {
  log: Logger;
  /** Per request, read at each (the config's `router.scrape_timeout`, which a reload may change). */
  timeoutMs: () => number;
  now: () => number;
  retry?: RetryPolicy;
  fetchText?: (url: string, timeoutMs: number) => Promise<string>;
  fetchJson?: (url: string, timeoutMs: number, apiKey: string) => Promise<unknown>;
  /** Where an endpoint's `api_key_env` is read (process.env): SGLang wants its key on its server info too. */
  env?: EnvLookup;
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
    const fields = { endpoint: e.id, url: engineRoot(e.url) };
    let found: EngineCapacity & { from: string };
    try {
      found = await this.ask(e);
    } catch (err) {
      if (!this.current(e)) return;
      this.probes.set(e.id, { url: e.url, state: "failed", failures: failures + 1, at: this.opts.now() });
      // Once per endpoint and url: a dark endpoint is retried every minute
      // for as long as it stays dark, and says so only the first time.
      if (failures === 0)
        this.opts.log.warn(
          "static endpoint's capacity unreadable: its unstated figures stay unknown while it is retried (state capacity.kv_tokens and capacity.max_num_seqs to skip the probe)",
          { ...fields, error: errorMessage(err) },
        );
      return;
    }
    if (!this.current(e)) return;
    const learned = learnedFor(e, found);
    if (learned.kvTokens !== undefined || learned.maxNumSeqs !== undefined) {
      this.probes.set(e.id, { url: e.url, state: "learned", capacity: learned });
      this.opts.log.info(`capacity of a static endpoint learned from its ${found.from}`, {
        ...fields,
        ...(learned.kvTokens !== undefined ? { kv_tokens: learned.kvTokens } : {}),
        ...(learned.maxNumSeqs !== undefined ? { max_num_seqs: learned.maxNumSeqs } : {}),
        why,
        ...(failures > 0 ? { afterFailures: failures } : {}),
      });
      return;
    }
    this.probes.set(e.id, { url: e.url, state: "absent" });
    // vLLM's batch is never in its answers: only a missing KV figure is news.
    if (e.capacity?.kv_tokens === undefined)
      this.opts.log.warn(
        "static endpoint's /metrics states no KV tokens (neither vLLM's cache_config_info nor SGLang's max_total_num_tokens): they stay unknown (state capacity.kv_tokens)",
        fields,
      );
  }

  /** /metrics, then SGLang's server info where the metrics are SGLang's and a figure is still missing. */
  private async ask(e: EndpointConfig): Promise<EngineCapacity & { from: string }> {
    const fetchText = this.opts.fetchText ?? fetchMetricsText;
    const fetchJson = this.opts.fetchJson ?? fetchEngineJson;
    const metrics = capacityInMetrics(await fetchText(metricsUrl(e.url), this.opts.timeoutMs()));
    const wantsInfo =
      e.capacity?.max_num_seqs === undefined || (e.capacity?.kv_tokens === undefined && !metrics.kvTokens);
    if (!metrics.sglang || !wantsInfo) return { kvTokens: metrics.kvTokens, from: "/metrics" };
    const urls = SGLANG_SERVER_INFO_PATHS.map((p) => `${engineRoot(e.url)}${p}`);
    const asked = await fetchFirstJson(
      urls,
      this.opts.timeoutMs(),
      staticEndpointKey(e, this.opts.env ?? {}),
      fetchJson,
    );
    const info = capacityFromServerInfo(asked.body);
    return {
      kvTokens: metrics.kvTokens || info.kvTokens,
      ...(info.maxNumSeqs !== undefined ? { maxNumSeqs: info.maxNumSeqs } : {}),
      from: `/metrics and ${new URL(asked.url).pathname}`,
    };
  }

  /** A probe's answer counts only while the endpoint is still there at the url it was asked at. */
  private current(e: EndpointConfig): boolean {
    const p = this.probes.get(e.id);
    return p?.state === "probing" && p.url === e.url;
  }
}
