/**
 * A model's demand, measured in replicas: how many replicas it would take
 * for every one of them to sit at saturation 1. Two sources feed it, and
 * either may be missing:
 *
 * - the edge's pool (EdgeSync GetPoolStatus, polled by the control plane):
 *   its saturation over the ready replicas, and what it could not serve at
 *   once — requests queued in any band and those shed (429 queue full, 503
 *   queue_ttl). The pool sees demand before any engine queue grows;
 * - the agents' scrapes of each ready replica: waiting requests over the
 *   router's `target_waiting` and KV use over its `kv_ceiling` (the same
 *   figures the edge's saturation reads, so they only ever raise it, as at
 *   the edge).
 *
 * A sample is `max(edge saturation, scraped saturation) × backlog × ready
 * replicas`, where backlog = (admitted + shed + queued) / admitted over the
 * last poll: the factor by which demand exceeded what the fleet took in.
 * Samples are kept per model over the scaling window; the signal is their
 * mean and their trend. Pure: the shell (controlplane/scaler.ts) reads the
 * sources and the clock.
 */

/** Beyond this, a backlog says "far too little" no more precisely; capping keeps one burst from asking for max at once. */
export const MAX_BACKLOG = 4;

/** The pool's lifetime counters and levels at one poll (PoolStatus, summed over bands). */
export interface EdgeReading {
  at: number;
  /** Undefined while no endpoint is routable. */
  saturation: number | undefined;
  queued: number;
  admitted: number;
  /** full (429) + expired (503). */
  shed: number;
}

/** The scraped load of a model's ready replicas. */
export interface AgentReading {
  ready: number;
  /** Ready replicas with a fresh scrape. */
  scraped: number;
  /** Mean over the scraped replicas of max(waiting / target_waiting, KV use / kv_ceiling). */
  saturation: number;
  waiting: number;
  kvUsage: number;
}

/** The figures of a pool's status that demand reads (EdgeSync PoolStatus, or the pool core's own). */
export interface PoolFigures {
  /** Negative or null while no endpoint is routable. */
  saturation: number | null;
  bands: readonly {
    depth: number;
    admitted: number | bigint;
    full: number | bigint;
    expired: number | bigint;
  }[];
}

export function edgeReading(at: number, pool: PoolFigures): EdgeReading {
  const sum = (f: (b: PoolFigures["bands"][number]) => number) => pool.bands.reduce((a, b) => a + f(b), 0);
  return {
    at,
    saturation: pool.saturation !== null && pool.saturation >= 0 ? pool.saturation : undefined,
    queued: sum((b) => b.depth),
    admitted: sum((b) => Number(b.admitted)),
    shed: sum((b) => Number(b.full) + Number(b.expired)),
  };
}

/** The agents' part, from the fresh scrapes of a model's `ready` replicas. */
export function agentReading(
  ready: number,
  loads: readonly { waiting: number; kvUsage: number }[],
  scoring: { target_waiting: number; kv_ceiling: number },
): AgentReading {
  const mean = (f: (l: { waiting: number; kvUsage: number }) => number) =>
    loads.length === 0 ? 0 : loads.reduce((a, l) => a + f(l), 0) / loads.length;
  return {
    ready,
    scraped: loads.length,
    saturation: mean((l) => Math.max(l.waiting / scoring.target_waiting, l.kvUsage / scoring.kv_ceiling)),
    waiting: mean((l) => l.waiting),
    kvUsage: mean((l) => l.kvUsage),
  };
}

/** Backlog over one poll interval, from two consecutive readings. */
export interface EdgeDelta {
  saturation: number | undefined;
  queued: number;
  admitted: number;
  shed: number;
  backlog: number;
}

export function edgeDelta(prev: EdgeReading | undefined, cur: EdgeReading): EdgeDelta {
  // A counter that went down is a pool that restarted and counts from zero.
  const grown = (now: number, before: number | undefined) =>
    before === undefined ? 0 : now >= before ? now - before : now;
  const admitted = grown(cur.admitted, prev?.admitted);
  const shed = grown(cur.shed, prev?.shed);
  const unserved = shed + cur.queued;
  const backlog = unserved === 0 ? 1 : Math.min(MAX_BACKLOG, (admitted + unserved) / Math.max(1, admitted));
  return { saturation: cur.saturation, queued: cur.queued, admitted, shed, backlog };
}

export interface DemandSample {
  at: number;
  /** Replicas' worth of demand; undefined when no source could say. */
  demand: number | undefined;
  ready: number;
  /** What each source said, or why it said nothing: the explanation's words. */
  sources: string[];
}

/**
 * One sample from whatever the sources gave. `edge` is undefined when the
 * control plane has no edge link or its last poll is stale (`edgeMissing`
 * says which); `agents.scraped` is 0 when no ready replica has a fresh scrape.
 */
export function sampleOf(
  at: number,
  edge: EdgeDelta | undefined,
  edgeMissing: string,
  agents: AgentReading,
): DemandSample {
  const sources: string[] = [];
  const levels: number[] = [];
  let backlog = 1;
  if (edge) {
    if (edge.saturation !== undefined) levels.push(edge.saturation);
    backlog = edge.backlog;
    sources.push(
      `edge: saturation ${edge.saturation === undefined ? "none (no routable endpoint)" : edge.saturation.toFixed(2)}, ` +
        `${edge.queued} queued, ${edge.shed} shed and ${edge.admitted} admitted since the previous poll`,
    );
  } else sources.push(`edge: ${edgeMissing}`);
  if (agents.scraped > 0) {
    levels.push(agents.saturation);
    sources.push(
      `agents: ${agents.scraped} of ${agents.ready} ready replica(s) scraped, waiting ${agents.waiting.toFixed(1)}, KV ${Math.round(agents.kvUsage * 100)}%`,
    );
  } else
    sources.push(
      agents.ready === 0
        ? "agents: no ready replica to scrape"
        : "agents: no fresh scrape of a ready replica",
    );
  if (levels.length === 0 || agents.ready === 0)
    return { at, demand: undefined, ready: agents.ready, sources };
  return { at, demand: Math.max(...levels) * backlog * agents.ready, ready: agents.ready, sources };
}

/** The window's verdict: mean demand, its trend, and how much of the window it covers. */
export interface DemandSignal {
  /** Mean demand in replicas over the window. */
  demand: number;
  /** The window's highest sample: a scale-down must hold even against it. */
  peak: number;
  /** Least-squares slope of demand, replicas per millisecond. */
  trendPerMs: number;
  /** From the oldest to the newest sample with a demand. */
  coveredMs: number;
  samples: number;
  /** The newest sample's sources. */
  sources: string[];
}

/** A model's samples over its window. */
export class DemandWindow {
  private samples: DemandSample[] = [];
  private latest: DemandSample | undefined;

  add(s: DemandSample, windowMs: number): void {
    this.latest = s;
    if (s.demand !== undefined) this.samples.push(s);
    const from = s.at - windowMs;
    const keep = this.samples.findIndex((x) => x.at >= from);
    this.samples = keep < 0 ? [] : this.samples.slice(keep);
  }

  /** The newest sample's sources, even when it had no demand. */
  get sources(): string[] {
    return this.latest?.sources ?? ["no sample yet"];
  }

  /** Undefined when the window holds no sample with a demand. */
  signal(): DemandSignal | undefined {
    const xs = this.samples;
    if (xs.length === 0) return undefined;
    const n = xs.length;
    const t0 = xs[0]!.at;
    const mean = xs.reduce((a, s) => a + s.demand!, 0) / n;
    const meanT = xs.reduce((a, s) => a + (s.at - t0), 0) / n;
    let cov = 0;
    let varT = 0;
    for (const s of xs) {
      cov += (s.at - t0 - meanT) * (s.demand! - mean);
      varT += (s.at - t0 - meanT) ** 2;
    }
    return {
      demand: mean,
      peak: Math.max(...xs.map((s) => s.demand!)),
      trendPerMs: varT > 0 ? cov / varT : 0,
      coveredMs: xs[n - 1]!.at - t0,
      samples: n,
      sources: this.sources,
    };
  }
}
