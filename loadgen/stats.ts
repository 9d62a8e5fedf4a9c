/**
 * What a load level measured: the figures `llmgw bench` prints and the
 * routing simulation reports, computed by the same code from per-request
 * results. Pure: times are plain seconds, whichever clock produced them.
 *
 * Percentiles are nearest-rank: the p-th percentile of n sorted samples is
 * the sample at rank ⌈p/100 · n⌉ (1-based), always a value that was
 * observed, never an interpolation. With few samples the high percentiles
 * are simply the largest values (p99 of 50 samples is the maximum).
 *
 * ITL percentiles are taken over every inter-token gap of every successful
 * request pooled together (as vLLM's `bench serve` does), not over
 * per-request means: a stream that stalls once shows up in the p90.
 */
import { renderTable } from "../common/text-table.ts";
import { DEFAULT_BANDS } from "./workloads.ts";

export interface RequestResult {
  ok: boolean;
  /** HTTP status; 0 when no response arrived (connection refused, timeout before headers). */
  status: number;
  /** Why it failed, as a short key errors are counted by: `429 rate_limit_exceeded`, `ECONNREFUSED`, `timeout`, `stream cut`. */
  error?: string;
  /** The failure's own message, for the first-error line. */
  errorMessage?: string;
  /** Request start → first output token, seconds. */
  ttft?: number;
  /** Request start → end of the response, seconds. */
  e2e: number;
  /** Every gap between consecutive output chunks, seconds. */
  itl?: ArrayLike<number>;
  /** Output tokens: the usage chunk's count, else the chunks counted. */
  outputTokens: number;
  promptTokens?: number;
  /** usage.prompt_tokens_details.cached_tokens, when the server reports it. */
  cachedTokens?: number;
  /** Recorded response headers (lower-case names), e.g. x-llmgw-endpoint. */
  headers?: Record<string, string>;
  /** The band the request asked for (x-llmgw-band), for per-band figures. */
  band?: string;
}

export type Load = { kind: "rate"; value: number } | { kind: "concurrency"; value: number };

export interface Percentiles {
  p50: number | null;
  p90: number | null;
  p99: number | null;
}

export interface LevelSummary {
  load: Load;
  /** Requests sent at this level. */
  requests: number;
  /** Requests that completed successfully. */
  completed: number;
  /** completed / requests (1 when nothing was sent). */
  successRate: number;
  /** Failed requests counted by RequestResult.error. */
  errors: Record<string, number>;
  /** The first failure's message, to say why without a log. */
  firstError?: string;
  /** From the first request sent to the last one finished. */
  seconds: number;
  /** Successful requests per second. */
  achievedRps: number;
  /** Output tokens of all requests (failed ones included) per second. */
  outputTokensPerSecond: number;
  outputTokens: number;
  promptTokens: number;
  /** Prompt tokens served from the prefix cache, when the server reports them (else undefined). */
  cachedTokens?: number;
  ttft: Percentiles;
  itl: Percentiles;
  e2e: Percentiles;
  /** Per x-llmgw-endpoint value: requests each endpoint answered, and max/mean over them. */
  endpoints?: { counts: Record<string, number>; maxOverMean: number };
  /** Per x-llmgw-route value (the routing tier that decided): request counts. */
  routes?: Record<string, number>;
  /** Per x-llmgw-admitted value (pool, grant, fail-open): how the edge let requests in. */
  admitted?: Record<string, number>;
  /** The same figures per requested band, when requests carried one (band-mix). */
  bands?: Record<string, LevelSummary>;
}

export const ENDPOINT_HEADER = "x-llmgw-endpoint";
export const ROUTE_HEADER = "x-llmgw-route";
export const ADMITTED_HEADER = "x-llmgw-admitted";

/** The edge's headers counted by value, each under its summary field and table column. */
const TALLIED = { routes: ROUTE_HEADER, admitted: ADMITTED_HEADER } as const;
type Tallied = keyof typeof TALLIED;
const TALLIES = Object.keys(TALLIED) as Tallied[];

/** Nearest-rank percentile of ascending `sorted`; null when empty. p in [0, 100]. */
export function percentile(sorted: ArrayLike<number>, p: number): number | null {
  const n = sorted.length;
  if (n === 0) return null;
  const rank = Math.max(1, Math.ceil((p / 100) * n));
  return sorted[Math.min(n, rank) - 1]!;
}

function percentiles(sorted: ArrayLike<number>): Percentiles {
  return { p50: percentile(sorted, 50), p90: percentile(sorted, 90), p99: percentile(sorted, 99) };
}

function count(into: Record<string, number>, key: string): void {
  into[key] = (into[key] ?? 0) + 1;
}

/**
 * Accumulates one level's results as they finish, so a long run keeps only
 * numbers (inter-token gaps in one growable Float64Array) and not every
 * request's response.
 */
export class LevelStats {
  private sent = 0;
  private ok = 0;
  private readonly errors: Record<string, number> = {};
  private firstError: string | undefined;
  private readonly ttfts: number[] = [];
  private readonly e2es: number[] = [];
  private gaps = new Float64Array(1024);
  private gapCount = 0;
  private output = 0;
  private prompt = 0;
  private cached: number | undefined;
  private readonly endpoints: Record<string, number> = {};
  private readonly tallies: Record<Tallied, Record<string, number>> = { routes: {}, admitted: {} };
  private readonly bands = new Map<string, LevelStats>();

  constructor(
    readonly load: Load,
    /** Endpoints that should have had traffic: counted as 0 if none answered, so max/mean shows the skew. */
    knownEndpoints: readonly string[] = [],
  ) {
    for (const e of knownEndpoints) this.endpoints[e] = 0;
  }

  add(r: RequestResult): void {
    if (r.band !== undefined) {
      const band = this.bands.get(r.band) ?? new LevelStats(this.load);
      this.bands.set(r.band, band);
      band.add({ ...r, band: undefined });
    }
    this.sent++;
    this.output += r.outputTokens;
    this.prompt += r.promptTokens ?? 0;
    if (r.cachedTokens !== undefined) this.cached = (this.cached ?? 0) + r.cachedTokens;
    const endpoint = r.headers?.[ENDPOINT_HEADER];
    if (endpoint) count(this.endpoints, endpoint);
    for (const t of TALLIES) {
      const value = r.headers?.[TALLIED[t]];
      if (value) count(this.tallies[t], value);
    }
    if (!r.ok) {
      count(this.errors, r.error ?? `status ${r.status}`);
      this.firstError ??= r.errorMessage ?? r.error;
      return;
    }
    this.ok++;
    if (r.ttft !== undefined) this.ttfts.push(r.ttft);
    this.e2es.push(r.e2e);
    const itl = r.itl;
    if (itl && itl.length > 0) {
      if (this.gapCount + itl.length > this.gaps.length) {
        const grown = new Float64Array(Math.max(this.gaps.length * 2, this.gapCount + itl.length));
        grown.set(this.gaps.subarray(0, this.gapCount));
        this.gaps = grown;
      }
      for (let i = 0; i < itl.length; i++) this.gaps[this.gapCount++] = itl[i]!;
    }
  }

  summary(seconds: number): LevelSummary {
    const sorted = (xs: number[]) => Float64Array.from(xs).sort();
    const counts = Object.values(this.endpoints);
    const mean = counts.reduce((s, c) => s + c, 0) / counts.length;
    return {
      load: this.load,
      requests: this.sent,
      completed: this.ok,
      successRate: this.sent === 0 ? 1 : this.ok / this.sent,
      errors: { ...this.errors },
      ...(this.firstError !== undefined ? { firstError: this.firstError } : {}),
      seconds,
      achievedRps: seconds > 0 ? this.ok / seconds : 0,
      outputTokensPerSecond: seconds > 0 ? this.output / seconds : 0,
      outputTokens: this.output,
      promptTokens: this.prompt,
      ...(this.cached !== undefined ? { cachedTokens: this.cached } : {}),
      ttft: percentiles(sorted(this.ttfts)),
      itl: percentiles(this.gaps.slice(0, this.gapCount).sort()),
      e2e: percentiles(sorted(this.e2es)),
      ...(counts.length > 0 && mean > 0
        ? { endpoints: { counts: { ...this.endpoints }, maxOverMean: Math.max(...counts) / mean } }
        : {}),
      ...Object.fromEntries(
        TALLIES.filter((t) => Object.keys(this.tallies[t]).length > 0).map((t) => [
          t,
          { ...this.tallies[t] },
        ]),
      ),
      ...(this.bands.size > 0
        ? { bands: Object.fromEntries([...this.bands].map(([b, st]) => [b, st.summary(seconds)])) }
        : {}),
    };
  }
}

/** One level's summary from a finished list of results. */
export function summarize(
  load: Load,
  results: Iterable<RequestResult>,
  seconds: number,
  knownEndpoints: readonly string[] = [],
): LevelSummary {
  const stats = new LevelStats(load, knownEndpoints);
  for (const r of results) stats.add(r);
  return stats.summary(seconds);
}

// ---------------------------------------------------------------------------
// Text

export function loadLabel(load: Load): string {
  return load.kind === "rate" ? `${load.value} req/s` : `${load.value} conc`;
}

/** Milliseconds with three significant-ish digits: 0.42, 4.21, 42.1, 421. */
export function ms(seconds: number | null): string {
  if (seconds === null) return "-";
  const v = seconds * 1000;
  if (v < 10) return v.toFixed(2);
  if (v < 100) return v.toFixed(1);
  return v.toFixed(0);
}

function rate(v: number): string {
  return v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0);
}

function tally(counts: Record<string, number>): string {
  return Object.entries(counts)
    .sort((a, b) => b[1] - a[1])
    .map(([k, n]) => `${k}:${n}`)
    .join(" ");
}

/**
 * One row per level. Optional columns (cache hits, endpoint spread, routes, admitted)
 * appear only when some level has them, so a run against a bare engine
 * does not print empty columns about a router.
 */
export function formatTable(levels: readonly LevelSummary[]): string {
  const cached = levels.some((l) => l.cachedTokens !== undefined);
  const spread = levels.some((l) => l.endpoints !== undefined);
  const tallied = TALLIES.filter((t) => levels.some((l) => l[t] !== undefined));
  const header = [
    "load",
    "sent",
    "ok %",
    "req/s",
    "out tok/s",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "TTFT p99 ms",
    "ITL p90 ms",
    "E2E p50 ms",
    ...(cached ? ["cached %"] : []),
    ...(spread ? ["endpoints max/mean"] : []),
    ...tallied,
    "errors",
  ];
  const rows = levels.map((l) => [
    loadLabel(l.load),
    String(l.requests),
    (l.successRate * 100).toFixed(1),
    rate(l.achievedRps),
    rate(l.outputTokensPerSecond),
    ms(l.ttft.p50),
    ms(l.ttft.p90),
    ms(l.ttft.p99),
    ms(l.itl.p90),
    ms(l.e2e.p50),
    ...(cached
      ? [
          l.cachedTokens === undefined || l.promptTokens === 0
            ? "-"
            : ((l.cachedTokens / l.promptTokens) * 100).toFixed(1),
        ]
      : []),
    ...(spread
      ? [
          l.endpoints
            ? `${l.endpoints.maxOverMean.toFixed(2)} (${Object.keys(l.endpoints.counts).length})`
            : "-",
        ]
      : []),
    ...tallied.map((t) => (l[t] ? tally(l[t]) : "-")),
    Object.keys(l.errors).length > 0 ? tally(l.errors) : "-",
  ]);
  return renderTable(header, rows) + bandTable(levels);
}

const BAND_ORDER = Object.keys(DEFAULT_BANDS);
const bandRank = (b: string) => (BAND_ORDER.includes(b) ? BAND_ORDER.indexOf(b) : BAND_ORDER.length);

/** Highest priority first for the usual names (platinum … bronze), any other band after them by name. */
export function sortBands(names: Iterable<string>): string[] {
  return [...new Set(names)].sort((a, b) => bandRank(a) - bandRank(b) || a.localeCompare(b));
}

/** Per-band rows under the main table (band-mix): what admission and priority do to each class. */
function bandTable(levels: readonly LevelSummary[]): string {
  const rows = levels.flatMap((l) =>
    sortBands(Object.keys(l.bands ?? {}))
      .map((band) => [band, l.bands![band]!] as const)
      .map(([band, s]) => [
        loadLabel(l.load),
        band,
        String(s.requests),
        (s.successRate * 100).toFixed(1),
        ms(s.ttft.p50),
        ms(s.ttft.p90),
        ms(s.ttft.p99),
        ms(s.e2e.p50),
        Object.keys(s.errors).length > 0 ? tally(s.errors) : "-",
      ]),
  );
  if (rows.length === 0) return "";
  const header = [
    "load",
    "band",
    "sent",
    "ok %",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "TTFT p99 ms",
    "E2E p50 ms",
    "errors",
  ];
  return `\nper band:\n${renderTable(header, rows)}`;
}
