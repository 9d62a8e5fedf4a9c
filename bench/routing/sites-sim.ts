/**
 * Two sites behind one pool on a virtual clock, and one of them lost whole
 * under load (docs/sites.md, "Measured"): the edge's real PoolCore (band
 * queues, the site stage, breakers, staleness) in front of each site's sim
 * engine cores, as bench/routing/fleet-sim.ts runs one fleet, plus what a
 * site's loss needs that it has not: the Worker's retries before the first
 * byte, engines that die, and a control plane whose pushes stop.
 *
 * At `lossAt` site A's engines and control plane are killed (`kill -9`): a
 * connection to them is refused at once, a stream that had not sent its first
 * token is retried on the lease's next alternate, one already answering is
 * cut, and A's load stops reaching the pool (`loss: "partition"`: the same,
 * each found out only when its timeout runs out). At `returnAt` A comes back
 * with empty engines and its control plane pushing again. Every attempt's
 * verdict reaches the pool with the request's release, after the response,
 * as the Worker's does; that is what opens the breakers.
 *
 * Pure: no timers, no I/O.
 */
import { mulberry32 } from "../../common/rng.ts";
import type { RouterConfig } from "../../edge/config/router.ts";
import { predictDemand } from "../../edge/routing/demand.ts";
import { plainEndpoint } from "../../edge/routing/plain-endpoint.ts";
import { type Admission, PoolCore, type Verdict } from "../../edge/routing/pool-core.ts";
import type { EndpointSpec, Location } from "../../edge/routing/types.ts";
import { EngineCore, type EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { promptTokenizer, type SimRequest } from "./fleet-sim.ts";
import { PoolAlarm } from "./pool-alarm.ts";
import { Timeline } from "./timeline.ts";

export interface SitesOptions {
  /** Site names, each with `enginesPerSite` engines; the first is the one lost. */
  sites: readonly string[];
  enginesPerSite: number;
  core: EngineCoreConfig;
  settings: RouterConfig;
  lossAt: number;
  returnAt: number;
  /**
   * How the site is lost: `kill` (refused connections, at once) or
   * `partition` (packets dropped: an attempt there fails only when its
   * timeout runs out — the header wait for a new one, the idle wait for a
   * stream under way). Either way its load stops reaching the pool, and it
   * comes back with empty engines.
   */
  loss?: "kill" | "partition";
  scrapeMs?: number;
  pushMs?: number;
  seed?: number;
}

export type LocatedRequest = SimRequest & { location: Location };

export interface SiteRequestResult {
  id: string;
  band: string;
  location: Location;
  arrival: number;
  /** 200, the pool's refusal (429/503), or 502 when every attempt failed before the first byte. */
  status: number;
  code?: string | undefined;
  /** The site of each attempt, when it started. */
  attempts: { site: string; at: number }[];
  firstToken?: number | undefined;
  /** A stream cut after its first token (its engine died): cannot be retried. */
  cut: boolean;
}

interface Engine {
  spec: EndpointSpec;
  site: string;
  core: EngineCore;
  busy: boolean;
  alive: boolean;
  /** Bumped on every death: a step scheduled before it lands on nothing. */
  epoch: number;
}

interface Flight {
  req: LocatedRequest;
  lease: string;
  targets: EndpointSpec[];
  verdicts: { endpoint: string; verdict: Verdict }[];
  engine: Engine | undefined;
}

export function simulateSites(opts: SitesOptions, requests: readonly LocatedRequest[]): SiteRequestResult[] {
  return new SitesSimulation(opts, requests).run();
}

class SitesSimulation {
  private readonly tl = new Timeline();
  private readonly pool: PoolCore;
  private readonly engines: Engine[] = [];
  private readonly byId = new Map<string, Engine>();
  private readonly tokens = promptTokenizer();
  private readonly results = new Map<string, SiteRequestResult>();
  private readonly flights = new Map<string, Flight>();
  private readonly alarm: PoolAlarm;
  private readonly lastArrival: number;
  private readonly pending: { endpoint: string; at: number; waiting: number; running: number; kv: number }[] =
    [];

  constructor(
    private readonly opts: SitesOptions,
    private readonly requests: readonly LocatedRequest[],
  ) {
    this.pool = new PoolCore("m", opts.settings, mulberry32(opts.seed ?? 1));
    this.alarm = new PoolAlarm(this.tl, this.pool);
    for (const site of opts.sites) {
      for (let i = 0; i < opts.enginesPerSite; i++) {
        const spec = plainEndpoint(`e${i}@${site}`, {
          site,
          url: `http://${site}-${i}`,
          capacity: { maxSeqs: opts.core.maxNumSeqs, kvTokens: opts.core.numBlocks * opts.core.blockSize },
        });
        const e = { spec, site, core: new EngineCore(opts.core), busy: false, alive: true, epoch: 0 };
        this.engines.push(e);
        this.byId.set(spec.id, e);
      }
    }
    this.pool.setEndpoints(
      1,
      this.engines.map((e) => e.spec),
      0,
    );
    this.lastArrival = requests.reduce((m, r) => Math.max(m, r.at), 0);
  }

  run(): SiteRequestResult[] {
    for (const req of this.requests) this.tl.at(req.at, () => this.arrive(req));
    this.tl.at(this.opts.lossAt, () => this.lose(this.opts.sites[0]!));
    this.tl.at(this.opts.returnAt, () => this.restore(this.opts.sites[0]!));
    this.scheduleLoad();
    while (this.tl.step()) {
      // Every callback schedules what follows it.
    }
    return [...this.results.values()];
  }

  private busy(): boolean {
    return this.tl.now < this.lastArrival || this.flights.size > 0;
  }

  private arrive(req: LocatedRequest): void {
    const band = req.band ?? this.opts.settings.admission.default_band;
    this.results.set(req.id, {
      id: req.id,
      band,
      location: req.location,
      arrival: this.tl.now,
      status: 200,
      attempts: [],
      cut: false,
    });
    this.pool.admit(
      {
        id: req.id,
        band,
        key: req.key ?? req.id,
        policy: "chat",
        prefix: [],
        location: req.location,
        demand: predictDemand(
          { messages: req.messages, max_tokens: req.maxTokens, stream: true },
          true,
          this.opts.settings.scoring.assumed_output_tokens,
        ),
      },
      this.tl.now,
      (a) => this.onAdmission(req, a),
    );
    this.alarm.arm();
  }

  private onAdmission(req: LocatedRequest, a: Admission): void {
    const r = this.results.get(req.id)!;
    if (!a.ok) {
      r.status = a.status;
      r.code = a.code;
      return;
    }
    const f: Flight = {
      req,
      lease: a.lease.id,
      targets: [a.lease.endpoint, ...a.lease.alternates],
      verdicts: [],
      engine: undefined,
    };
    this.flights.set(req.id, f);
    this.attempt(f);
  }

  /** The next target: refused at once by a dead engine, then the one after it, as the Worker retries. */
  private attempt(f: Flight): void {
    const r = this.results.get(f.req.id)!;
    const spec = f.targets.shift();
    if (!spec) {
      r.status = 502;
      r.code = "upstream_unreachable";
      this.finish(f);
      return;
    }
    const e = this.byId.get(spec.id)!;
    r.attempts.push({ site: e.site, at: this.tl.now });
    if (!e.alive) {
      f.verdicts.push({ endpoint: spec.id, verdict: "fail" });
      this.tl.at(this.tl.now + this.unreachableMs("header"), () => this.attempt(f));
      return;
    }
    f.engine = e;
    e.core.submit({
      id: f.req.id,
      promptIds: this.tokens(f.req.messages),
      maxTokens: f.req.maxTokens,
      naturalLength: Number.POSITIVE_INFINITY,
      nextToken: (k) => k,
      arrival: this.tl.now / 1000,
    });
    this.kick(e);
  }

  private finish(f: Flight): void {
    this.flights.delete(f.req.id);
    this.pool.release(f.lease, { attempts: f.verdicts }, this.tl.now);
    this.alarm.arm();
  }

  private kick(e: Engine): void {
    if (!e.alive || e.busy || !e.core.hasWork()) return;
    const step = e.core.startStep();
    if (!step) return;
    e.busy = true;
    const epoch = e.epoch;
    this.tl.at(this.tl.now + step.seconds * 1000, () => {
      if (e.epoch !== epoch) return;
      e.busy = false;
      for (const ev of e.core.finishStep(this.tl.now / 1000)) {
        if (ev.kind !== "token") continue;
        const f = this.flights.get(ev.seq.spec.id)!;
        const r = this.results.get(f.req.id)!;
        if (ev.index === 0) {
          r.firstToken = this.tl.now;
          this.pool.prefilled(f.lease, this.tl.now);
        }
        if (ev.finished) {
          f.verdicts.push({ endpoint: e.spec.id, verdict: "ok" });
          this.finish(f);
        }
      }
      this.kick(e);
    });
  }

  /** `kill -9` of a site's engines and control plane. */
  private lose(site: string): void {
    for (const e of this.engines) {
      if (e.site !== site) continue;
      e.alive = false;
      e.busy = false;
      e.epoch++;
      e.core = new EngineCore(this.opts.core);
    }
    for (const f of [...this.flights.values()]) {
      if (!f.engine || f.engine.site !== site || f.engine.alive) continue;
      const r = this.results.get(f.req.id)!;
      f.verdicts.push({ endpoint: f.engine.spec.id, verdict: "fail" });
      f.engine = undefined;
      if (r.firstToken === undefined)
        this.tl.at(this.tl.now + this.unreachableMs("header"), () => this.attempt(f));
      else
        this.tl.at(this.tl.now + this.unreachableMs("idle"), () => {
          r.cut = true;
          this.finish(f);
        });
    }
  }

  /** How long an attempt at a lost site takes to fail: at once if refused, its timeout if partitioned. */
  private unreachableMs(wait: "header" | "idle"): number {
    if (this.opts.loss !== "partition") return wait === "header" ? 1 : 0;
    const t = this.opts.settings.timeouts;
    return wait === "header" ? t.response_header : t.idle;
  }

  /** The site back: empty engines, its control plane pushing again. */
  private restore(site: string): void {
    for (const e of this.engines) if (e.site === site) e.alive = true;
  }

  /** Scrapes each live engine every scrapeMs; its site's control plane pushes every pushMs while it runs. */
  private scheduleLoad(): void {
    const scrapeMs = this.opts.scrapeMs ?? 2_000;
    const pushMs = this.opts.pushMs ?? 1_000;
    this.engines.forEach((e, i) => {
      const scrape = () => {
        if (e.alive) {
          const g = e.core.gauges();
          this.pending.push({
            endpoint: e.spec.id,
            at: this.tl.now,
            waiting: g.waiting,
            running: g.running,
            kv: g.kvUsage,
          });
        }
        if (this.busy()) this.tl.at(this.tl.now + scrapeMs, scrape);
      };
      this.tl.at((scrapeMs * i) / this.engines.length, scrape);
    });
    const push = () => {
      const batch = this.pending.splice(0);
      if (batch.length > 0) {
        this.pool.updateLoad(
          batch.map((p) => ({
            endpoint: p.endpoint,
            sample: {
              waiting: p.waiting,
              running: p.running,
              kvUsage: p.kv,
              prefixCacheHitRate: 0,
              at: p.at,
              state: "ready" as const,
            },
          })),
          this.tl.now,
        );
        this.alarm.arm();
      }
      if (this.busy()) this.tl.at(this.tl.now + pushMs, push);
    };
    this.tl.at(pushMs / 2, push);
  }
}
