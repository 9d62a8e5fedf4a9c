/**
 * Engine load from the engine's own Prometheus endpoint, the one signal every
 * engine already exports. The parser is pure and forgiving line by line (a
 * malformed line is skipped and counted, the rest still counts), bounded in
 * what it accepts, and knows nothing about HTTP.
 */
import { create } from "@bufbuild/protobuf";
import { type ShardLoad, ShardLoadSchema } from "../proto/gen/agent/v1/agent_pb.ts";
import type { MetricNames } from "./engines/adapter.ts";
import { engineUrl } from "./health-probe.ts";

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface ParseResult {
  samples: Sample[];
  /** "line N: why", at most MAX_ERRORS of them. */
  errors: string[];
}

const MAX_ERRORS = 20;
export const MAX_METRICS_BYTES = 4 * 1024 * 1024;
const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;

function parseValue(text: string): number | undefined {
  switch (text) {
    case "NaN":
      return Number.NaN;
    case "+Inf":
    case "Inf":
      return Number.POSITIVE_INFINITY;
    case "-Inf":
      return Number.NEGATIVE_INFINITY;
  }
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) return undefined;
  return Number(text);
}

/** Parses one sample line; throws a short reason on malformed input. */
function parseLine(line: string): Sample {
  const m = NAME.exec(line);
  if (!m) throw new Error("no metric name");
  const name = m[0];
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === "{") {
    i++;
    for (;;) {
      while (line[i] === " ") i++;
      if (line[i] === "}") {
        i++;
        break;
      }
      const ln = LABEL_NAME.exec(line.slice(i));
      if (!ln) throw new Error("bad label name");
      i += ln[0].length;
      if (line[i] !== "=" || line[i + 1] !== '"') throw new Error(`label ${ln[0]} has no quoted value`);
      i += 2;
      let value = "";
      for (;;) {
        const c = line[i];
        if (c === undefined) throw new Error("unterminated label value");
        if (c === '"') break;
        if (c === "\\") {
          const e = line[i + 1];
          value += e === "n" ? "\n" : (e ?? "");
          i += 2;
          continue;
        }
        value += c;
        i++;
      }
      i++;
      labels[ln[0]] = value;
      while (line[i] === " ") i++;
      if (line[i] === ",") i++;
      else if (line[i] !== "}") throw new Error("expected , or } after label");
    }
  }
  if (line[i] !== " " && line[i] !== "\t") throw new Error("expected a space before the value");
  const rest = line.slice(i).trim().split(/\s+/);
  if (rest.length < 1 || rest.length > 2 || !rest[0])
    throw new Error("expected a value and an optional timestamp");
  const value = parseValue(rest[0]);
  if (value === undefined) throw new Error(`bad value "${rest[0].slice(0, 40)}"`);
  return { name, labels, value };
}

export function parsePrometheusText(text: string, keep?: (name: string) => boolean): ParseResult {
  const samples: Sample[] = [];
  const errors: string[] = [];
  let errorCount = 0;
  const lines =
    text.length > MAX_METRICS_BYTES ? text.slice(0, MAX_METRICS_BYTES).split("\n") : text.split("\n");
  lines.forEach((raw, n) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    if (keep) {
      const m = NAME.exec(line);
      if (m && !keep(m[0])) return;
    }
    try {
      samples.push(parseLine(line));
    } catch (err) {
      errorCount++;
      if (errors.length < MAX_ERRORS) errors.push(`line ${n + 1}: ${(err as Error).message}`);
    }
  });
  if (errorCount > errors.length) errors.push(`… and ${errorCount - errors.length} more`);
  return { samples, errors };
}

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
  /** Tokens its KV cache holds, from the cache-config info metric; 0 when it exports none. */
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
  const kvCapacityTokens = names.cacheConfig ? kvTokensOf(samples, names.cacheConfig) : 0;
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

/** num_gpu_blocks × block_size of each engine's cache-config series (one per data-parallel engine), summed. */
function kvTokensOf(samples: readonly Sample[], name: string): number {
  let total = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    const blocks = Number(s.labels.num_gpu_blocks);
    const size = Number(s.labels.block_size);
    if (Number.isSafeInteger(blocks) && Number.isSafeInteger(size) && blocks > 0 && size > 0)
      total += blocks * size;
  }
  return total;
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

/** GET the metrics text with a hard timeout and a size bound. */
export async function fetchMetricsText(url: string, timeoutMs: number): Promise<string> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`${url}: HTTP ${res.status}`);
  }
  const declared = Number(res.headers.get("content-length") ?? "0");
  if (declared > MAX_METRICS_BYTES) {
    await res.body?.cancel();
    throw new Error(`${url}: metrics body of ${declared} bytes is over the limit`);
  }
  const text = await res.text();
  if (text.length > MAX_METRICS_BYTES) throw new Error(`${url}: metrics body over the limit`);
  return text;
}

/** One engine's scraper: remembers the previous counters so every scrape yields a rate. */
export class LoadScraper {
  private prev: { counters?: PrefixCounters; prefixCacheHitRate: number } | undefined;
  readonly url: string;
  private readonly wanted: Set<string>;

  constructor(
    host: string,
    port: number,
    path: string,
    private readonly names: MetricNames,
    /** A number, or read at each scrape (the control plane may change it). */
    private readonly timeoutMs: number | (() => number) = 1_000,
    private readonly now: () => number = Date.now,
    /** The engine's batch, as its launch says; reported with every load. */
    private readonly maxNumSeqs = 0,
  ) {
    this.url = engineUrl(host, port, path);
    const hr = names.prefixHitRate;
    const base = [names.waiting, names.running, names.kvUsage, names.generationTokens];
    base.push(...(hr.kind === "gauge" ? [hr.name] : [hr.queries, hr.hits]));
    if (names.cacheConfig) base.push(names.cacheConfig);
    this.wanted = new Set(base.flatMap((n) => [n, `${n}_total`]));
  }

  async scrape(): Promise<{ load: ShardLoad; reading: LoadReading; errors: string[] }> {
    const timeout = typeof this.timeoutMs === "number" ? this.timeoutMs : this.timeoutMs();
    const text = await fetchMetricsText(this.url, timeout);
    const { samples, errors } = parsePrometheusText(text, (n) => this.wanted.has(n));
    const reading = loadFromSamples(samples, this.names, this.prev);
    this.prev = { counters: reading.counters, prefixCacheHitRate: reading.prefixCacheHitRate };
    return { load: toShardLoad(reading, this.now(), this.maxNumSeqs), reading, errors };
  }
}
