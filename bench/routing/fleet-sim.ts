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
import { type Admission, PoolCore } from "../../edge/routing/pool-core.ts";
import { requestPrefixHashes } from "../../edge/routing/prefix-hash.ts";
import type { RouteTier, RoutingPolicy } from "../../edge/routing/types.ts";
import { EngineCore, type EngineCoreConfig } from "../../sim-engine/engine-core.ts";
import { BOS, chatPromptTokens, tokenize } from "../../sim-engine/text.ts";

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

/** A small binary heap of timed callbacks; ties run in scheduling order. */
export class Timeline {
  private heap: { t: number; seq: number; run: () => void }[] = [];
  private seq = 0;
  now = 0;

  at(t: number, run: () => void): void {
    const h = this.heap;
    h.push({ t, seq: this.seq++, run });
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (before(h[p]!, h[i]!)) break;
      [h[p], h[i]] = [h[i]!, h[p]!];
      i = p;
    }
  }

  /** Runs everything due, in order; returns false when nothing is left. */
  step(): boolean {
    const h = this.heap;
    const top = h[0];
    if (!top) return false;
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && before(h[l]!, h[m]!)) m = l;
        if (r < h.length && before(h[r]!, h[m]!)) m = r;
        if (m === i) break;
        [h[m], h[i]] = [h[i]!, h[m]!];
        i = m;
      }
    }
    this.now = top.t;
    top.run();
    return true;
  }
}

function before(a: { t: number; seq: number }, b: { t: number; seq: number }): boolean {
  return a.t < b.t || (a.t === b.t && a.seq < b.seq);
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
  const model = opts.model ?? "m";
  const scrapeMs = opts.scrapeMs ?? 2_000;
  const pushMs = opts.pushMs ?? 1_000;
  const tl = new Timeline();
  const rand = mulberry32(opts.seed ?? 1);
  const pool = new PoolCore(model, opts.settings, rand);
  const engines: Engine[] = Array.from({ length: opts.engines }, (_, i) => ({
    id: `e${i}`,
    core: new EngineCore(opts.core),
    busy: false,
    requests: 0,
  }));
  const byId = new Map(engines.map((e) => [e.id, e]));
  const known = opts.knownCapacity ?? true;
  const assumed = opts.settings.scoring.assumed_output_tokens;
  pool.setEndpoints(
    1,
    engines.map((e) => ({
      id: e.id,
      url: `http://${e.id}`,
      spillGroup: "default",
      priority: 0,
      weight: 1,
      via: "direct",
      ...(known
        ? { capacity: { maxSeqs: opts.core.maxNumSeqs, kvTokens: opts.core.numBlocks * opts.core.blockSize } }
        : {}),
    })),
    0,
  );
  const tokens = promptTokenizer();
  const results = new Map<string, RequestResult>();
  let open = 0;
  const prevAt = new Map<string, number>();
  const leaseOf = new Map<string, string>();

  const kick = (e: Engine) => {
    if (e.busy || !e.core.hasWork()) return;
    const step = e.core.startStep();
    if (!step) return;
    e.busy = true;
    tl.at(tl.now + step.seconds * 1000, () => {
      e.busy = false;
      for (const ev of e.core.finishStep(tl.now / 1000)) {
        if (ev.kind !== "token") continue;
        const r = results.get(ev.seq.spec.id)!;
        r.outputTokens++;
        if (ev.index === 0) r.firstToken = tl.now;
        else r.gaps.push(tl.now - (prevAt.get(r.id) ?? tl.now));
        prevAt.set(r.id, tl.now);
        if (ev.finished) {
          r.end = tl.now;
          open--;
          prevAt.delete(r.id);
          pool.release(leaseOf.get(r.id)!, { attempts: [{ endpoint: e.id, verdict: "ok" }] }, tl.now);
          afterPool();
        }
      }
      kick(e);
    });
  };

  // The pool may answer any waiter during any call; each answer lands here.
  const onAdmission = (req: SimRequest) => (a: Admission) => {
    const r = results.get(req.id)!;
    if (!a.ok) {
      r.status = a.status;
      r.code = a.code;
      r.end = tl.now;
      open--;
      return;
    }
    const e = byId.get(a.lease.endpoint.id)!;
    r.endpoint = e.id;
    r.route = a.lease.route;
    r.queuedMs = a.lease.queuedMs;
    leaseOf.set(req.id, a.lease.id);
    e.requests++;
    e.core.submit({
      id: req.id,
      promptIds: tokens(req.messages),
      maxTokens: req.maxTokens,
      naturalLength: Number.POSITIVE_INFINITY,
      nextToken: (k) => k,
      arrival: tl.now / 1000,
    });
    kick(e);
  };

  let wake = Number.POSITIVE_INFINITY;
  const afterPool = () => {
    const at = pool.nextWakeAt();
    if (at === undefined || at >= wake) return;
    wake = at;
    tl.at(at, () => {
      if (wake !== at) return;
      wake = Number.POSITIVE_INFINITY;
      pool.tick(tl.now);
      afterPool();
    });
  };

  const band = opts.settings.admission.default_band;
  for (const req of requests) {
    tl.at(req.at, () => {
      open++;
      results.set(req.id, {
        id: req.id,
        band: req.band ?? band,
        status: 200,
        arrival: tl.now,
        queuedMs: 0,
        outputTokens: 0,
        gaps: [],
      });
      pool.admit(
        {
          id: req.id,
          band: req.band ?? band,
          key: req.key ?? req.session ?? req.id,
          policy: opts.policy,
          session: req.session,
          prefix: requestPrefixHashes(model, { messages: req.messages }),
          // Estimated from the body as the Worker does, so its error is the real one.
          ...(known
            ? { demand: predictDemand({ messages: req.messages, max_tokens: req.maxTokens }, true, assumed) }
            : {}),
        },
        tl.now,
        onAdmission(req),
      );
      afterPool();
    });
  }

  // Scrapes and pushes run while there is traffic to route.
  const lastArrival = requests.reduce((m, r) => Math.max(m, r.at), 0);
  const pending: { endpoint: string; at: number; waiting: number; running: number; kvUsage: number }[] = [];
  engines.forEach((e, i) => {
    const scrape = () => {
      const g = e.core.gauges();
      pending.push({
        endpoint: e.id,
        at: tl.now,
        waiting: g.waiting,
        running: g.running,
        kvUsage: g.kvUsage,
      });
      if (tl.now < lastArrival || results.size < requests.length || open > 0)
        tl.at(tl.now + scrapeMs, scrape);
    };
    tl.at((scrapeMs * i) / engines.length, scrape);
  });
  const push = () => {
    if (pending.length > 0) {
      pool.updateLoad(
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
      afterPool();
    }
    if (tl.now < lastArrival || results.size < requests.length || open > 0) tl.at(tl.now + pushMs, push);
  };
  tl.at(pushMs / 2, push);

  const marks = new Map<string, { start?: [number, number]; end?: [number, number] }>();
  const mark = (which: "start" | "end") => () => {
    for (const e of engines) {
      const m = marks.get(e.id) ?? {};
      m[which] = [e.core.metrics.prefixQueries, e.core.metrics.prefixHits];
      marks.set(e.id, m);
    }
  };
  if (opts.window) {
    tl.at(opts.window.start, mark("start"));
    tl.at(opts.window.end, mark("end"));
  }

  while (tl.step()) {
    // Every callback schedules what follows it.
  }

  let first = Number.POSITIVE_INFINITY;
  let last = 0;
  for (const r of results.values()) {
    first = Math.min(first, r.arrival);
    last = Math.max(last, r.end ?? r.arrival);
  }
  return {
    requests: [...results.values()],
    engines: engines.map((e) => {
      const m = marks.get(e.id);
      const [q0, h0] = m?.start ?? [0, 0];
      const [q1, h1] = m?.end ?? [e.core.metrics.prefixQueries, e.core.metrics.prefixHits];
      return {
        id: e.id,
        requests: e.requests,
        prefixQueries: e.core.metrics.prefixQueries,
        prefixHits: e.core.metrics.prefixHits,
        ...(opts.window ? { window: { prefixQueries: q1 - q0, prefixHits: h1 - h0 } } : {}),
      };
    }),
    durationMs: Number.isFinite(first) ? last - first : 0,
  };
}
