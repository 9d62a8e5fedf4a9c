import { DurableObject } from "cloudflare:workers";
import { endpointSpec } from "../config/catalog.ts";
import type { RouterConfig } from "../config/router.ts";
import { DEFAULT_SITE, SiteParts, siteFeeds } from "../config/site-sets.ts";
import { type ConfigEnv, edgeConfig, invalidateEdgeConfig } from "../config/store.ts";
import {
  type BreakerOpened,
  type Exchange,
  type ExchangeAnswer,
  type LoadUpdate,
  PoolCore,
  type PoolStatus,
} from "../routing/pool-core.ts";
import { PoolExchange } from "../routing/pool-exchange.ts";
import type { EndpointSpec } from "../routing/types.ts";

/**
 * One per model (named by the model): the shared state every edge isolate
 * routes by — endpoints, live load, in-flight counts, breakers, sessions,
 * the prefix index and the band queues. A thin shell around PoolCore: it
 * turns the core's callbacks into promises, runs its timer, and keeps its
 * endpoint set and settings current (pushed by EdgeSync on change, read
 * from KV on a cold start or when a Worker has seen a newer version).
 *
 * The endpoints are each site's part, kept at that site's version
 * (edge/config/site-sets.ts), so a site's older set, pushed late or read from a
 * KV copy not yet caught up, never replaces a newer one; the core routes
 * over their union.
 *
 * State is memory only: after an eviction (no request for a while) the pool
 * starts empty, which forgets in-flight counts of requests long finished
 * and breakers long cooled.
 */
export class ModelPool extends DurableObject<ConfigEnv> {
  private core: PoolCore | undefined;
  private desk: PoolExchange | undefined;
  private settings: RouterConfig | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private readonly parts = new SiteParts<EndpointSpec>();

  /** The core for `model`, created from the KV config the first time. */
  private async ready(model: string, endpointsVersion = 0): Promise<PoolCore> {
    const c = edgeConfig(this.env, (p) => this.ctx.waitUntil(p));
    let config = c instanceof Promise ? await c : c;
    const held = Math.max(config.table.endpoints.version, this.core?.version ?? 0);
    if (held < endpointsVersion) {
      // A Worker has seen a newer endpoint set than this pool holds, pushed
      // or read. Checked against the pushed set too: otherwise, while KV
      // still serves this isolate the old set, every admit would read KV.
      invalidateEdgeConfig();
      config = await edgeConfig(this.env);
    }
    if (!this.core) {
      this.core = new PoolCore(model, config.settings);
      this.settings = config.settings;
    } else if (config.settings !== this.settings) {
      this.settings = config.settings;
      this.core.configure(config.settings, Date.now());
    }
    let changed = false;
    const { table } = config;
    for (const [site, version] of config.siteVersions) {
      if (version <= this.parts.versionOf(site)) continue;
      const mine = table
        .endpointsFor(model)
        .filter((e) => (table.siteOfEndpoint(e.id) ?? DEFAULT_SITE) === site);
      changed = this.parts.set(site, version, mine.map(endpointSpec)) || changed;
    }
    if (changed) this.core.setEndpoints(this.parts.version, this.parts.union(), Date.now());
    return this.core;
  }

  /** An isolate's coalesced call (edge/routing/pool-channel.ts): its admits, releases and abandons. */
  async exchange(model: string, ex: Exchange): Promise<ExchangeAnswer> {
    const core = await this.ready(model, ex.endpointsVersion);
    this.desk ??= new PoolExchange(core);
    const desk = this.desk;
    let opened: BreakerOpened[] = [];
    const answer = new Promise<ExchangeAnswer>((resolve) => {
      opened = desk.exchange(ex, Date.now(), resolve);
    });
    for (const b of opened) {
      console.warn(
        `breaker opened: model ${model}, endpoint ${b.endpoint}, after ${b.failures} failures: ${b.reason}`,
      );
    }
    this.schedule();
    return answer;
  }

  /** One site's endpoints for this model at the site's version, pushed by EdgeSync (edge/sync/site-write.ts). */
  async setSiteEndpoints(
    model: string,
    site: string,
    version: number,
    endpoints: EndpointSpec[],
  ): Promise<void> {
    const core = await this.ready(model);
    if (this.parts.set(site, version, endpoints))
      core.setEndpoints(this.parts.version, this.parts.union(), Date.now());
    this.schedule();
  }

  /** The default site's endpoints (a single-site edge, the benchmarks). */
  async setEndpoints(model: string, version: number, endpoints: EndpointSpec[]): Promise<void> {
    await this.setSiteEndpoints(model, DEFAULT_SITE, version, endpoints);
  }

  async pushLoad(model: string, updates: LoadUpdate[]): Promise<void> {
    (await this.ready(model)).updateLoad(updates, Date.now());
    this.schedule();
  }

  async status(model: string): Promise<PoolStatus> {
    const status = (await this.ready(model)).status(Date.now());
    status.calls = this.desk?.counters.calls ?? 0;
    const feeds = siteFeeds(status.endpoints, this.settings?.stale_after ?? 0);
    status.sites = this.parts
      .sites()
      .filter((p) => p.endpoints > 0)
      .map((p) => ({
        ...p,
        loadFeed: feeds.get(p.site) ?? "none",
        routed: status.routedBySite[p.site] ?? 0,
        routedLastMinute: status.routedLastMinuteBySite[p.site] ?? 0,
      }));
    return status;
  }

  /** One timer for whatever the core next waits on: a queue TTL, a re-check while queued, a lease's expiry. */
  private schedule(): void {
    const at = Math.min(
      this.core?.nextWakeAt() ?? Number.POSITIVE_INFINITY,
      this.desk?.nextWakeAt() ?? Number.POSITIVE_INFINITY,
    );
    if (at >= this.timerAt) return;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.timerAt = Number.POSITIVE_INFINITY;
        const now = Date.now();
        this.core?.tick(now);
        this.desk?.tick(now);
        this.schedule();
      },
      Math.max(0, at - Date.now()),
    );
  }
}
