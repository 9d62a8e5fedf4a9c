/**
 * Engine load from the engine's own Prometheus endpoint, the one signal every
 * engine already exports: the samples (common/prometheus-text.ts) read into
 * a load, purely, and a scraper that fetches them on the agent's schedule.
 */
import { create } from "@bufbuild/protobuf";
import { doublingDelay } from "../common/backoff.ts";
import { kvCapacityOf } from "../common/engine-capacity.ts";
import { fetchFirstJson, fetchMetricsText } from "../common/engine-fetch.ts";
import { parsePrometheusText, type Sample } from "../common/prometheus-text.ts";
import type { EngineCapacity } from "../common/sglang-server-info.ts";
import { type ShardLoad, ShardLoadSchema } from "../proto/gen/agent/v1/agent_pb.ts";
import type { CapacityProbe, MetricNames } from "./engines/adapter.ts";
import { engineUrl } from "./health-probe.ts";

/** Counters are exposed with a `_total` suffix by newer clients and without by older ones; accept both. */
function series(samples: readonly Sample[], name: string): Sample[] {
  const total = `${name}_total`;
  const exact = samples.filter((s) => s.name === name);
  return exact.length > 0 ? exact : samples.filter((s) => s.name === total);
}

function finite(values: number[]): number[] {
  return values.filter((v) => Number.isFinite(v));
}

/** Counts add up across series (one per data-parallel engine); fractions average. */
function sum(samples: readonly Sample[], name: string): number | undefined {
  const v = finite(series(samples, name).map((s) => s.value));
  return v.length ? v.reduce((a, b) => a + b, 0) : undefined;
}

function mean(samples: readonly Sample[], name: string): number | undefined {
  const v = finite(series(samples, name).map((s) => s.value));
  return v.length ? v.reduce((a, b) => a + b, 0) / v.length : undefined;
}

const clamp01 = (x: number) => Math.min(1, Math.max(0, x));

export interface PrefixCounters {
  queries: number;
  hits: number;
}

export interface LoadReading {
  waiting: number;
  running: number;
  kvUsage: number;
  prefixCacheHitRate: number;
  /** The engine's lifetime generated tokens (0 when it exports none). */
  generationTokens: number;
  /** Tokens its KV cache holds, as its metrics say (MetricNames.kvCapacity); 0 when they say none. */
  kvCapacityTokens: number;
  /** Carried to the next reading, to turn counters into a rate. */
  counters?: PrefixCounters;
  /** Which expected metrics were absent (an engine of another kind, or one still starting). */
  missing: string[];
}

/**
 * Pure: a load reading from one scrape. vLLM's prefix-cache figures are
 * lifetime counters, so the hit rate is hits/queries over the interval since
 * `prev`; with no previous scrape it is the lifetime ratio, across a counter
 * reset (engine restart) the new values count from zero, and over an interval
 * without queries the previous rate stands.
 */
export function loadFromSamples(
  samples: readonly Sample[],
  names: MetricNames,
  prev?: { counters?: PrefixCounters; prefixCacheHitRate: number },
): LoadReading {
  const missing: string[] = [];
  const need = (name: string, v: number | undefined) => {
    if (v === undefined) missing.push(name);
    return v ?? 0;
  };
  const waiting = need(names.waiting, sum(samples, names.waiting));
  const running = need(names.running, sum(samples, names.running));
  const kvUsage = clamp01(need(names.kvUsage, mean(samples, names.kvUsage)));
  let prefixCacheHitRate = prev?.prefixCacheHitRate ?? 0;
  let counters: PrefixCounters | undefined;
  const hr = names.prefixHitRate;
  if (hr.kind === "gauge") {
    const v = mean(samples, hr.name);
    if (v === undefined) missing.push(hr.name);
    else prefixCacheHitRate = clamp01(v);
  } else {
    const q = sum(samples, hr.queries);
    const h = sum(samples, hr.hits);
    if (q === undefined || h === undefined) {
      if (q === undefined) missing.push(hr.queries);
      if (h === undefined) missing.push(hr.hits);
    } else {
      counters = { queries: q, hits: h };
      const p = prev?.counters;
      const reset = p !== undefined && (q < p.queries || h < p.hits);
      const dq = p && !reset ? q - p.queries : q;
      const dh = p && !reset ? h - p.hits : h;
      if (dq > 0) prefixCacheHitRate = clamp01(dh / dq);
    }
  }
  const generationTokens = sum(samples, names.generationTokens) ?? 0;
  const kvCapacityTokens = names.kvCapacity ? kvCapacityOf(samples, names.kvCapacity) : 0;
  return {
    waiting,
    running,
    kvUsage,
    prefixCacheHitRate,
    generationTokens,
    kvCapacityTokens,
    counters,
    missing,
  };
}

/** `maxNumSeqs`: the batch the engine runs at once, as its launch says (0: unknown). */
export function toShardLoad(r: LoadReading, scrapedAtUnixMs: number, maxNumSeqs = 0): ShardLoad {
  return create(ShardLoadSchema, {
    waiting: r.waiting,
    running: r.running,
    kvUsage: r.kvUsage,
    prefixCacheHitRate: r.prefixCacheHitRate,
    generationTokens: r.generationTokens,
    scrapedAtUnixMs: BigInt(scrapedAtUnixMs),
    maxNumSeqs,
    kvCapacityTokens: BigInt(r.kvCapacityTokens),
  });
}

/** What is known of an engine's capacity besides its metrics. */
export interface KnownCapacity {
  /** The batch as its launch says (0 or absent: unknown). */
  maxNumSeqs?: number;
  /** Where the engine states its capacity itself; asked until it answers. */
  probe?: CapacityProbe | null;
  /** The key the engine was launched to require, for the probe ("" or absent: none). */
  apiKey?: string;
}

/** A probe that fails is asked again after 5 s, 10 s, … up to a minute: an engine is asked at most that often. */
const PROBE_RETRY = { baseMs: 5_000, maxMs: 60_000 };

/** One engine's scraper: remembers the previous counters so every scrape yields a rate. */
export class LoadScraper {
  private prev: { counters?: PrefixCounters; prefixCacheHitRate: number } | undefined;
  readonly url: string;
  private readonly wanted: Set<string>;
  private readonly probeUrls: string[];
  private probed: EngineCapacity | undefined;
  private probeFailures = 0;
  private probeAgainAt = 0;

  constructor(
    host: string,
    port: number,
    path: string,
    private readonly names: MetricNames,
    /** A number, or read at each scrape (the control plane may change it). */
    private readonly timeoutMs: number | (() => number) = 1_000,
    private readonly now: () => number = Date.now,
    private readonly known: KnownCapacity = {},
    /** Called once with what the probe learned, and with each of its failures. */
    private readonly onProbe: (
      outcome: { learned: EngineCapacity } | { error: string; failures: number },
    ) => void = () => {},
  ) {
    this.url = engineUrl(host, port, path);
    this.probeUrls = (known.probe?.paths ?? []).map((p) => engineUrl(host, port, p));
    const hr = names.prefixHitRate;
    const base = [names.waiting, names.running, names.kvUsage, names.generationTokens];
    base.push(...(hr.kind === "gauge" ? [hr.name] : [hr.queries, hr.hits]));
    if (names.kvCapacity) base.push(names.kvCapacity.name);
    this.wanted = new Set(base.flatMap((n) => [n, `${n}_total`]));
  }

  async scrape(): Promise<{ load: ShardLoad; reading: LoadReading; errors: string[] }> {
    const timeout = typeof this.timeoutMs === "number" ? this.timeoutMs : this.timeoutMs();
    const [text] = await Promise.all([fetchMetricsText(this.url, timeout), this.probeIfDue(timeout)]);
    const { samples, errors } = parsePrometheusText(text, (n) => this.wanted.has(n));
    const reading = loadFromSamples(samples, this.names, this.prev);
    this.prev = { counters: reading.counters, prefixCacheHitRate: reading.prefixCacheHitRate };
    // The engine's own word on its batch wins over its launch's: a flag
    // only caps what SGLang sizes from memory.
    const seqs = this.probed?.maxNumSeqs ?? this.known.maxNumSeqs ?? 0;
    if (reading.kvCapacityTokens === 0 && this.probed?.kvTokens)
      reading.kvCapacityTokens = this.probed.kvTokens;
    return { load: toShardLoad(reading, this.now(), seqs), reading, errors };
  }

  private async probeIfDue(timeoutMs: number): Promise<void> {
    const probe = this.known.probe;
    if (!probe || this.probed || this.now() < this.probeAgainAt) return;
    try {
      this.probed = probe.read((await fetchFirstJson(this.probeUrls, timeoutMs, this.known.apiKey)).body);
      this.onProbe({ learned: this.probed });
    } catch (err) {
      this.probeFailures++;
      this.probeAgainAt =
        this.now() + doublingDelay(this.probeFailures, PROBE_RETRY.baseMs, PROBE_RETRY.maxMs);
      this.onProbe({ error: err instanceof Error ? err.message : String(err), failures: this.probeFailures });
    }
  }
}
