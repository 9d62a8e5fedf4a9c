/**
 * The control plane's view of the edge: every `edge.status_interval` it
 * asks the Worker for each model's pool (EdgeSync GetPoolStatus) and keeps
 * the latest answer per model, when it came, the last failure, and fifteen
 * minutes of samples for plots. `ctl status`, the dashboard and the
 * `llmgw_edge_*` metrics all read this one copy, so the edge is asked once
 * per interval however many look.
 *
 * Tokens per second come from the engines, not the edge: the agents scrape
 * each engine's generation_tokens_total with its load, and the rate is the
 * growth of those counters between two polls. The edge sees the same tokens
 * only as they stream through, per key, not per model.
 */
import { create } from "@bufbuild/protobuf";
import type { EdgeSyncClient } from "../common/edgesync-client.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import {
  type EdgeModel,
  EdgeModelSchema,
  type EdgeSample,
  EdgeSampleSchema,
  type GetEdgeStatusResponse,
  GetEdgeStatusResponseSchema,
} from "../proto/gen/control/v1/control_pb.ts";
import type { PoolStatus } from "../proto/gen/edge/v1/edgesync_pb.ts";

export const HISTORY_MS = 15 * 60_000;

/** One serving replica's lifetime generated tokens, as the load board last heard. */
export interface TokenCounter {
  model: string;
  replica: string;
  tokens: number;
}

interface Kept {
  pool: PoolStatus;
  at: number;
  history: EdgeSample[];
}

/** Pure: what was polled, kept. */
export class EdgeStatusBook {
  private readonly models = new Map<string, Kept>();
  private tokens = new Map<string, TokenCounter>();
  private tokensAt: number | undefined;
  lastError = "";
  lastErrorAt = 0;
  lastSuccessAt = 0;
  pollErrors = 0;

  /**
   * A successful poll: `pools` replaces what was kept (a model the edge no
   * longer reports goes, with its history); each model gets a sample.
   */
  record(pools: readonly PoolStatus[], counters: readonly TokenCounter[], at: number): void {
    const rates = this.tokenRates(counters, at);
    const seen = new Set<string>();
    for (const pool of pools) {
      seen.add(pool.model);
      const kept = this.models.get(pool.model) ?? { pool, at, history: [] };
      kept.pool = pool;
      kept.at = at;
      kept.history.push(
        create(EdgeSampleSchema, {
          atUnixMs: BigInt(at),
          saturation: pool.saturation,
          queueDepth: Object.fromEntries(pool.bands.map((b) => [b.name, b.depth])),
          generatedTokensPerSecond: rates.get(pool.model) ?? 0,
        }),
      );
      const from = BigInt(at - HISTORY_MS);
      const old = kept.history.findIndex((s) => s.atUnixMs > from);
      if (old > 0) kept.history.splice(0, old);
      this.models.set(pool.model, kept);
    }
    for (const model of this.models.keys()) if (!seen.has(model)) this.models.delete(model);
    this.lastSuccessAt = at;
    this.lastError = "";
    this.lastErrorAt = 0;
  }

  failed(error: string, at: number): void {
    this.pollErrors++;
    this.lastError = error;
    this.lastErrorAt = at;
  }

  /** The latest pool of each model (for the metrics). */
  pools(): PoolStatus[] {
    return [...this.models.values()].map((k) => k.pool);
  }

  /** A model's latest pool and when it was polled (for scaling's demand signal). */
  polled(model: string): { pool: PoolStatus; at: number } | undefined {
    const k = this.models.get(model);
    return k ? { pool: k.pool, at: k.at } : undefined;
  }

  /** Age of the latest successful poll, or undefined before the first. */
  ageMs(now: number): number | undefined {
    return this.lastSuccessAt > 0 ? Math.max(0, now - this.lastSuccessAt) : undefined;
  }

  view(now: number, edge: { url: string; intervalMs: number }, model = ""): GetEdgeStatusResponse {
    const models: EdgeModel[] = [];
    for (const [name, k] of [...this.models].sort(([a], [b]) => a.localeCompare(b))) {
      if (model !== "" && name !== model) continue;
      models.push(
        create(EdgeModelSchema, {
          model: name,
          pool: k.pool,
          polledAtUnixMs: BigInt(k.at),
          ageMs: BigInt(Math.max(0, now - k.at)),
          history: [...k.history],
        }),
      );
    }
    return create(GetEdgeStatusResponseSchema, {
      configured: true,
      edgeUrl: edge.url,
      pollIntervalMs: edge.intervalMs,
      models,
      lastError: this.lastError,
      lastErrorAtUnixMs: BigInt(this.lastErrorAt),
      pollErrors: BigInt(this.pollErrors),
      lastSuccessAtUnixMs: BigInt(this.lastSuccessAt),
    });
  }

  /**
   * Tokens per second per model since the previous poll. A replica's counter
   * that went down was an engine restart: it counted from zero. A replica
   * not there at the previous poll adds nothing yet (its lifetime count is
   * not this interval's), so the first sample after a start reads 0.
   */
  private tokenRates(counters: readonly TokenCounter[], at: number): Map<string, number> {
    const rates = new Map<string, number>();
    const seconds = this.tokensAt === undefined ? 0 : (at - this.tokensAt) / 1000;
    for (const c of counters) {
      const prev = this.tokens.get(c.replica);
      if (!prev || seconds <= 0) continue;
      const grown = c.tokens >= prev.tokens ? c.tokens - prev.tokens : c.tokens;
      rates.set(c.model, (rates.get(c.model) ?? 0) + grown / seconds);
    }
    this.tokens = new Map(counters.map((c) => [c.replica, c]));
    this.tokensAt = at;
    return rates;
  }
}

export interface EdgeStatusPollerOptions {
  client: EdgeSyncClient;
  url: string;
  intervalMs: number;
  log: Logger;
  counters: () => TokenCounter[];
  now: () => number;
}

/** The timer and the call around an EdgeStatusBook. */
export class EdgeStatusPoller {
  readonly book = new EdgeStatusBook();
  private timer: NodeJS.Timeout | undefined;
  private busy = false;

  constructor(private readonly opts: EdgeStatusPollerOptions) {}

  start(): void {
    this.timer = setInterval(() => void this.poll(), this.opts.intervalMs);
    void this.poll();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  view(model = ""): GetEdgeStatusResponse {
    return this.book.view(this.opts.now(), { url: this.opts.url, intervalMs: this.opts.intervalMs }, model);
  }

  async poll(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    const { client, log, now } = this.opts;
    try {
      // A poll that outlives its interval would only delay the next one.
      const { pools } = await client.getPoolStatus({ model: "" }, { timeoutMs: this.opts.intervalMs });
      if (this.book.pollErrors > 0 && this.book.lastError !== "")
        log.info("edge status reachable again", { pollErrors: this.book.pollErrors });
      this.book.record(pools, this.opts.counters(), now());
    } catch (err) {
      // A warning on the first failure of a run of them, then every 60th.
      const first = this.book.lastError === "";
      this.book.failed(errorMessage(err), now());
      if (first || this.book.pollErrors % 60 === 0)
        log.warn("edge status poll failed", { error: errorMessage(err), pollErrors: this.book.pollErrors });
    } finally {
      this.busy = false;
    }
  }
}
