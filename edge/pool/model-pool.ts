import { DurableObject } from "cloudflare:workers";
import { endpointSpec } from "../config/catalog.ts";
import type { RouterConfig } from "../config/router.ts";
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

  /** The core for `model`, created from the KV config the first time. */
  private async ready(model: string, endpointsVersion = 0): Promise<PoolCore> {
    const c = edgeConfig(this.env);
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
    if (config.table.endpoints.version > this.core.version) {
      this.core.setEndpoints(
        config.table.endpoints.version,
        config.table.endpointsFor(model).map(endpointSpec),
        Date.now(),
      );
    }
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

  async setEndpoints(model: string, version: number, endpoints: EndpointSpec[]): Promise<void> {
    const core = await this.ready(model);
    core.setEndpoints(version, endpoints, Date.now());
    this.schedule();
  }

  async pushLoad(model: string, updates: LoadUpdate[]): Promise<void> {
    (await this.ready(model)).updateLoad(updates, Date.now());
    this.schedule();
  }

  async status(model: string): Promise<PoolStatus> {
    return (await this.ready(model)).status(Date.now());
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
