/**
 * The model's own predictions, computed by running the very EngineCore the
 * server runs, on a virtual clock: a closed loop (C clients, each sending its
 * next request when the previous one ends) or the replay of a trace of
 * arrivals (open loop: a recorded run, a Poisson process, a burst). The
 * benchmark prints these beside what it measures against the real process,
 * and the calibration (calibration.ts) beside published vLLM figures.
 */
import { EngineCore, type EngineCoreConfig } from "./engine-core.ts";
import type { Seq, SeqEvent } from "./scheduler.ts";

/** What happened to one request, in simulated seconds. */
export interface RequestRecord {
  arrival: number;
  firstToken: number;
  end: number;
  outputTokens: number;
}

export interface ClosedLoopWorkload {
  concurrency: number;
  requestsPerClient: number;
  prompt: (client: number, round: number) => number[];
  /** Output tokens of every request, or of request `round` of `client`. */
  outputTokens: number | ((client: number, round: number) => number);
  /** Simulated seconds between a response ending and the client's next request. */
  gapSeconds?: number;
  /** When each client sends its first request (default: all at 0). */
  startAt?: (client: number) => number;
}

export interface ClosedLoopResult {
  requests: number;
  outputTokens: number;
  seconds: number;
  outputTokensPerSecond: number;
  ttftMean: number;
  itlMean: number;
  e2eMean: number;
  /** Every finished request, in the order it finished. */
  perRequest: RequestRecord[];
}

/** Where requests come from: told the clock, it submits what is due; told of a finish, it may plan more. */
interface Arrivals {
  submitDue(core: EngineCore, clock: number): void;
  /** When the next request not yet submitted arrives; undefined when none is planned. */
  nextAt(): number | undefined;
  finished(seq: Seq, clock: number): void;
}

/** Sums the latencies of the token events a run produces. */
class Tally {
  tokens = 0;
  done = 0;
  private ttftSum = 0;
  private itlSum = 0;
  private itlCount = 0;
  private e2eSum = 0;
  readonly perRequest: RequestRecord[] = [];

  /** Counts one event; returns the sequence if it finished. */
  take(ev: SeqEvent): Seq | undefined {
    if (ev.kind !== "token") return undefined;
    this.tokens++;
    const seq = ev.seq;
    if (ev.index === 0) this.ttftSum += ev.at - seq.spec.arrival;
    else if (ev.prevAt !== undefined) {
      this.itlSum += ev.at - ev.prevAt;
      this.itlCount++;
    }
    if (!ev.finished) return undefined;
    this.done++;
    this.e2eSum += ev.at - seq.spec.arrival;
    this.perRequest.push({
      arrival: seq.spec.arrival,
      firstToken: seq.firstTokenAt ?? ev.at,
      end: ev.at,
      outputTokens: seq.outputLen,
    });
    return seq;
  }

  get ttftMean(): number {
    return this.done > 0 ? this.ttftSum / this.done : 0;
  }
  get itlMean(): number {
    return this.itlCount > 0 ? this.itlSum / this.itlCount : 0;
  }
  get e2eMean(): number {
    return this.done > 0 ? this.e2eSum / this.done : 0;
  }
}

/** Steps the core until no request is running, waiting or still to arrive; returns the final clock. */
function drive(core: EngineCore, arrivals: Arrivals, tally: Tally, start: number): number {
  let clock = start;
  for (;;) {
    arrivals.submitDue(core, clock);
    const step = core.startStep();
    if (!step) {
      const next = arrivals.nextAt();
      if (next === undefined) return clock;
      clock = next;
      continue;
    }
    clock += step.seconds;
    for (const ev of core.finishStep(clock)) {
      const seq = tally.take(ev);
      if (seq) arrivals.finished(seq, clock);
    }
  }
}

const submit = (core: EngineCore, id: string, prompt: number[], outputTokens: number, arrival: number) =>
  core.submit({
    id,
    promptIds: prompt,
    maxTokens: outputTokens,
    naturalLength: Number.POSITIVE_INFINITY,
    nextToken: (k) => k,
    arrival,
  });

export function simulateClosedLoop(cfg: EngineCoreConfig, w: ClosedLoopWorkload): ClosedLoopResult {
  const gap = w.gapSeconds ?? 0;
  const out = w.outputTokens;
  const pending: { client: number; round: number; at: number }[] = [];
  for (let c = 0; c < w.concurrency; c++) pending.push({ client: c, round: 0, at: w.startAt?.(c) ?? 0 });
  const tally = new Tally();
  const seconds = drive(
    new EngineCore(cfg),
    {
      submitDue(core, clock) {
        for (let i = 0; i < pending.length; ) {
          const p = pending[i]!;
          if (p.at > clock) {
            i++;
            continue;
          }
          pending.splice(i, 1);
          const tokens = typeof out === "number" ? out : out(p.client, p.round);
          submit(core, `${p.client}/${p.round}`, w.prompt(p.client, p.round), tokens, clock);
        }
      },
      nextAt: () => (pending.length > 0 ? Math.min(...pending.map((p) => p.at)) : undefined),
      finished(seq, clock) {
        const [client, round] = seq.spec.id.split("/").map(Number) as [number, number];
        if (round + 1 < w.requestsPerClient) pending.push({ client, round: round + 1, at: clock + gap });
      },
    },
    tally,
    0,
  );
  return {
    requests: tally.done,
    outputTokens: tally.tokens,
    seconds,
    outputTokensPerSecond: seconds > 0 ? tally.tokens / seconds : 0,
    ttftMean: tally.ttftMean,
    itlMean: tally.itlMean,
    e2eMean: tally.e2eMean,
    perRequest: tally.perRequest,
  };
}

export interface TraceRequest {
  at: number;
  prompt: number[];
  outputTokens: number;
}

export interface TraceResult {
  requests: number;
  outputTokens: number;
  /** From the first arrival to the last token. */
  seconds: number;
  ttftMean: number;
  itlMean: number;
  e2eMean: number;
  /** Every finished request, in the order it finished. */
  perRequest: RequestRecord[];
}

/**
 * Open-loop replay: the requests arrive exactly when the trace says. The
 * benchmark records when its closed-loop clients really sent each request
 * and asks the model what those arrivals should have produced, so jitter
 * in the client does not count against the engine. A trace of Poisson
 * arrivals is vLLM's `--request-rate`; one with every request at the same
 * instant is its burst (`--request-rate inf`) and an offline batch.
 */
export function replayTrace(cfg: EngineCoreConfig, trace: TraceRequest[]): TraceResult {
  const queue = [...trace].sort((a, b) => a.at - b.at);
  const t0 = queue[0]?.at ?? 0;
  let next = 0;
  const tally = new Tally();
  const end = drive(
    new EngineCore(cfg),
    {
      submitDue(core, clock) {
        for (; next < queue.length && queue[next]!.at <= clock; next++) {
          const r = queue[next]!;
          submit(core, String(next), r.prompt, r.outputTokens, r.at);
        }
      },
      nextAt: () => queue[next]?.at,
      finished() {},
    },
    tally,
    t0,
  );
  return {
    requests: tally.done,
    outputTokens: tally.tokens,
    seconds: end - t0,
    ttftMean: tally.ttftMean,
    itlMean: tally.itlMean,
    e2eMean: tally.e2eMean,
    perRequest: tally.perRequest,
  };
}
