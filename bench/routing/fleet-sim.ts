/**
 * A fleet on a virtual clock: the edge's real routing modules (PoolCore:
 * band queues, picker, breakers, prefix index) in front of N sim engine
 * cores (the EngineCore `llmgw sim-engine` runs), as a discrete-event
 * simulation. Minutes of traffic take seconds, and the same seed gives the
 * same run.
 *
 * What the pool sees is what it would see deployed: its own in-flight
 * counts at once, and each engine's waiting/running/KV as an agent scraped
 * it (every `scrapeMs`, each engine at its own phase) and the control plane
 * pushed it (every `pushMs`) — stale by up to scrapeMs + pushMs.
 *
 * Pure: no timers, no I/O. Time is in milliseconds; the engine cores count
 * in seconds.
 */

import { mulberry32 } from "../../common/rng.ts";
import type { RouterConfig } from "../../edge/config/router.ts";
import { predictDemand } from "../../edge/routing/demand.ts";
import { plainEndpoint } from "../../edge/routing/plain-endpoint.ts";
import { type Admission, PoolCore } from "../../edge/routing/pool-core.ts";
import { requestPrefixHashes } from "../../edge/routing/prefix-hash.ts";
import type { RouteTier, RoutingPolicy } from "../../edge/routing/types.ts";
import { EngineCore, type EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { BOS, chatPromptTokens, tokenize } from "../../sim-engine/text.ts";
import { PoolAlarm } from "./pool-alarm.ts";
import { Timeline } from "./timeline.ts";

export interface SimMessage {
  role: string;
  content: string;
}

export interface SimRequest {
  id: string;
  /** Arrival, ms from the start. */
  at: number;
  messages: readonly SimMessage[];
  /** Exact output length (the engine runs to it, as with ignore_eos). */
  maxTokens: number;
  session?: string | undefined;
  band?: string | undefined;
  key?: string | undefined;
}

export interface FleetOptions {
  engines: number;
  core: EngineCoreConfig;
  policy: RoutingPolicy;
  settings: RouterConfig;
  model?: string;
  scrapeMs?: number;
  pushMs?: number;
  seed?: number;
  /** A span (ms) to report engine counters for on their own, e.g. the run minus its warm-up. */
  window?: { start: number; end: number };
  /**
   * As deployed since capacity became known (default): each endpoint
   * carries its engine's batch and KV tokens, and each admit its predicted
   * demand. False is the design before it: no capacity, no demand, only
   * the in-flight target.
   */
  knownCapacity?: boolean;
  /**
   * Streams whose first token reaches the pool (default), so it counts what
   * still waits for its prefill. False is the design before that: the
   * pool's charges are freed at the release only. Only with knownCapacity.
   */
  firstTokens?: boolean;
}

export interface RequestResult {
  id: string;
  band: string;
  /** 200, or the pool's refusal status (429/503). */
  status: number;
  code?: string | undefined;
  endpoint?: string | undefined;
  route?: RouteTier | undefined;
  arrival: number;
  /** Time in the band's queue. */
  queuedMs: number;
  firstToken?: number | undefined;
  end?: number | undefined;
  outputTokens: number;
  /** Every gap between two tokens of this request, ms. */
  gaps: number[];
}

export interface EngineResult {
  id: string;
  requests: number;
  prefixQueries: number;
  prefixHits: number;
  /** Within FleetOptions.window, when one was given. */
  window?: { prefixQueries: number; prefixHits: number };
}

export interface FleetResult {
  requests: RequestResult[];
  engines: EngineResult[];
  /** From the first arrival to the last token. */
  durationMs: number;
}

/**
 * The sim engine's chat template, with each message's tokens computed once:
 * a shared-prefix workload repeats the same long system prompts thousands
 * of times. The template's own tokens are read off the real template.
 */
export function promptTokenizer(): (messages: readonly SimMessage[]) => number[] {
  const cache = new Map<string, number[]>();
  const frame = new Map<string, { head: number[]; tail: number }>();
  const generation = chatPromptTokens([]).slice(1);
  const frameOf = (role: string) => {
    let f = frame.get(role);
    if (!f) {
      const t = chatPromptTokens([{ role, content: "" }]);
      f = { head: t.slice(1, t.length - generation.length - 1), tail: t[t.length - generation.length - 1]! };
      frame.set(role, f);
    }
    return f;
  };
  const bodyOf = (content: string) => {
    let body = cache.get(content);
    if (!body) {
      body = tokenize(content);
      cache.set(content, body);
    }
    return body;
  };
  return (messages) => {
    let n = 1 + generation.length;
    const parts = messages.map((m) => {
      const f = frameOf(m.role);
      const body = bodyOf(m.content);
      n += f.head.length + body.length + 1;
      return { f, body };
    });
    const ids = new Array<number>(n);
    let at = 0;
    ids[at++] = BOS;
    for (const { f, body } of parts) {
      for (const t of f.head) ids[at++] = t;
      for (let i = 0; i < body.length; i++) ids[at++] = body[i]!;
      ids[at++] = f.tail;
    }
    for (const t of generation) ids[at++] = t;
    return ids;
  };
}

interface Engine {
  id: string;
  core: EngineCore;
  busy: boolean;
  requests: number;
}

export function simulateFleet(opts: FleetOptions, requests: readonly SimRequest[]): FleetResult {
  return new FleetSimulation(opts, requests).run();
}

interface PendingLoad {
  endpoint: string;
  at: number;
  waiting: number;
  running: number;
  kvUsage: number;
}

/**
 * One run: the pool, the engines and the requests on one virtual clock.
 * Each event schedules what follows it; `run` schedules the arrivals, the
 * scrapes, the pushes and the window's marks, in that order (ties run in
 * scheduling order), then steps the clock dry.
 */
class FleetSimulation {
  private readonly model: string;
  private readonly known: boolean;
  private readonly firstTokens: boolean;
  private readonly tl = new Timeline();
  private readonly pool: PoolCore;
  private readonly engines: Engine[];
  private readonly byId: Map<string, Engine>;
  private readonly tokens = promptTokenizer();
  private readonly results = new Map<string, RequestResult>();
  private open = 0;
  private readonly prevAt = new Map<string, number>();
  private readonly leaseOf = new Map<string, string>();
  private readonly alarm: PoolAlarm;
  private readonly lastArrival: number;
  private readonly marks = new Map<string, { start?: [number, number]; end?: [number, number] }>();

  constructor(
    private readonly opts: FleetOptions,
    private readonly requests: readonly SimRequest[],
  ) {
    this.model = opts.model ?? "m";
    this.pool = new PoolCore(this.model, opts.settings, mulberry32(opts.seed ?? 1));
    this.alarm = new PoolAlarm(this.tl, this.pool);
    this.engines = Array.from({ length: opts.engines }, (_, i) => ({
      id: `e${i}`,
      core: new EngineCore(opts.core),
      busy: false,
      requests: 0,
    }));
    this.byId = new Map(this.engines.map((e) => [e.id, e]));
    this.known = opts.knownCapacity ?? true;
    this.firstTokens = this.known && (opts.firstTokens ?? true);
    this.pool.setEndpoints(
      1,
      this.engines.map((e) =>
        plainEndpoint(
          e.id,
          this.known
            ? {
                capacity: {
                  maxSeqs: opts.core.maxNumSeqs,
                  kvTokens: opts.core.numBlocks * opts.core.blockSize,
                },
              }
            : {},
        ),
      ),
      0,
    );
    this.lastArrival = requests.reduce((m, r) => Math.max(m, r.at), 0);
  }

  run(): FleetResult {
    for (const req of this.requests) this.tl.at(req.at, () => this.arrive(req));
    this.scheduleScrapesAndPushes();
    if (this.opts.window) {
      this.tl.at(this.opts.window.start, () => this.mark("start"));
      this.tl.at(this.opts.window.end, () => this.mark("end"));
    }
    while (this.tl.step()) {
      // Every callback schedules what follows it.
    }
    return this.result();
  }

  /** Whether traffic is still to come or in flight: scrapes and pushes run only then. */
  private busy(): boolean {
    return this.tl.now < this.lastArrival || this.results.size < this.requests.length || this.open > 0;
  }

  private arrive(req: SimRequest): void {
    const tl = this.tl;
    const band = req.band ?? this.opts.settings.admission.default_band;
    this.open++;
    this.results.set(req.id, {
      id: req.id,
      band,
      status: 200,
      arrival: tl.now,
      queuedMs: 0,
      outputTokens: 0,
      gaps: [],
    });
    this.pool.admit(
      {
        id: req.id,
        band,
        key: req.key ?? req.session ?? req.id,
        policy: this.opts.policy,
        session: req.session,
        prefix: requestPrefixHashes(this.model, { messages: req.messages }),
        // Estimated from the body as the Worker does, so its error is the real one.
        ...(this.known
          ? {
              demand: predictDemand(
                { messages: req.messages, max_tokens: req.maxTokens, stream: this.firstTokens },
                true,
                this.opts.settings.scoring.assumed_output_tokens,
              ),
            }
          : {}),
      },
      tl.now,
      (a) => this.onAdmission(req, a),
    );
    this.alarm.arm();
  }

  /** The pool may answer any waiter during any call; each answer lands here. */
  private onAdmission(req: SimRequest, a: Admission): void {
    const r = this.results.get(req.id)!;
    if (!a.ok) {
      r.status = a.status;
      r.code = a.code;
      r.end = this.tl.now;
      this.open--;
      return;
    }
    const e = this.byId.get(a.lease.endpoint.id)!;
    r.endpoint = e.id;
    r.route = a.lease.route;
    r.queuedMs = a.lease.queuedMs;
    this.leaseOf.set(req.id, a.lease.id);
    e.requests++;
    e.core.submit({
      id: req.id,
      promptIds: this.tokens(req.messages),
      maxTokens: req.maxTokens,
      naturalLength: Number.POSITIVE_INFINITY,
      nextToken: (k) => k,
      arrival: this.tl.now / 1000,
    });
    this.kick(e);
  }

  /** Starts the engine's next step if it is idle and has work; the step's tokens land when it ends. */
  private kick(e: Engine): void {
    if (e.busy || !e.core.hasWork()) return;
    const step = e.core.startStep();
    if (!step) return;
    e.busy = true;
    const tl = this.tl;
    tl.at(tl.now + step.seconds * 1000, () => {
      e.busy = false;
      for (const ev of e.core.finishStep(tl.now / 1000)) {
        if (ev.kind !== "token") continue;
        const r = this.results.get(ev.seq.spec.id)!;
        r.outputTokens++;
        if (ev.index === 0) {
          r.firstToken = tl.now;
          // As soon as it comes, whatever the lease says: the fleet is one isolate with no round trip.
          if (this.firstTokens) this.pool.prefilled(this.leaseOf.get(r.id)!, tl.now);
        } else r.gaps.push(tl.now - (this.prevAt.get(r.id) ?? tl.now));
        this.prevAt.set(r.id, tl.now);
        if (ev.finished) {
          r.end = tl.now;
          this.open--;
          this.prevAt.delete(r.id);
          this.pool.release(
            this.leaseOf.get(r.id)!,
            { attempts: [{ endpoint: e.id, verdict: "ok" }] },
            tl.now,
          );
          this.alarm.arm();
        }
      }
      this.kick(e);
    });
  }

  /** Each engine scraped every scrapeMs (staggered), the samples pushed to the pool every pushMs, as the agents and the control plane do. */
  private scheduleScrapesAndPushes(): void {
    const tl = this.tl;
    const scrapeMs = this.opts.scrapeMs ?? 2_000;
    const pushMs = this.opts.pushMs ?? 1_000;
    const pending: PendingLoad[] = [];
    this.engines.forEach((e, i) => {
      const scrape = () => {
        const g = e.core.gauges();
        pending.push({
          endpoint: e.id,
          at: tl.now,
          waiting: g.waiting,
          running: g.running,
          kvUsage: g.kvUsage,
        });
        if (this.busy()) tl.at(tl.now + scrapeMs, scrape);
      };
      tl.at((scrapeMs * i) / this.engines.length, scrape);
    });
    const push = () => {
      if (pending.length > 0) {
        this.pool.updateLoad(
          pending.splice(0).map((p) => ({
            endpoint: p.endpoint,
            sample: {
              waiting: p.waiting,
              running: p.running,
              kvUsage: p.kvUsage,
              prefixCacheHitRate: 0,
              at: p.at,
              state: "ready" as const,
            },
          })),
          tl.now,
        );
        this.alarm.arm();
      }
      if (this.busy()) tl.at(tl.now + pushMs, push);
    };
    tl.at(pushMs / 2, push);
  }

  private mark(which: "start" | "end"): void {
    for (const e of this.engines) {
      const m = this.marks.get(e.id) ?? {};
      m[which] = [e.core.metrics.prefixQueries, e.core.metrics.prefixHits];
      this.marks.set(e.id, m);
    }
  }

  private result(): FleetResult {
    let first = Number.POSITIVE_INFINITY;
    let last = 0;
    for (const r of this.results.values()) {
      first = Math.min(first, r.arrival);
      last = Math.max(last, r.end ?? r.arrival);
    }
    return {
      requests: [...this.results.values()],
      engines: this.engines.map((e) => {
        const m = this.marks.get(e.id);
        const [q0, h0] = m?.start ?? [0, 0];
        const [q1, h1] = m?.end ?? [e.core.metrics.prefixQueries, e.core.metrics.prefixHits];
        return {
          id: e.id,
          requests: e.requests,
          prefixQueries: e.core.metrics.prefixQueries,
          prefixHits: e.core.metrics.prefixHits,
          ...(this.opts.window ? { window: { prefixQueries: q1 - q0, prefixHits: h1 - h0 } } : {}),
        };
      }),
      durationMs: Number.isFinite(first) ? last - first : 0,
    };
  }
}
