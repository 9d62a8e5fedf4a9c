/**
 * The model's own prediction for a closed-loop benchmark (C clients, each
 * sending its next request when the previous one ends), computed by running
 * the very EngineCore the server runs, on a virtual clock. The benchmark
 * prints these beside what it measures against the real process.
 */
import { EngineCore, type EngineCoreConfig } from "./engine-core.ts";

export interface ClosedLoopWorkload {
  concurrency: number;
  requestsPerClient: number;
  prompt: (client: number, round: number) => number[];
  outputTokens: number;
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
}

export function simulateClosedLoop(cfg: EngineCoreConfig, w: ClosedLoopWorkload): ClosedLoopResult {
  const core = new EngineCore(cfg);
  const gap = w.gapSeconds ?? 0;
  const pending: { client: number; round: number; at: number }[] = [];
  for (let c = 0; c < w.concurrency; c++) pending.push({ client: c, round: 0, at: w.startAt?.(c) ?? 0 });
  let clock = 0;
  let ttftSum = 0;
  let itlSum = 0;
  let itlCount = 0;
  let e2eSum = 0;
  let done = 0;
  let tokens = 0;
  const submitDue = () => {
    for (let i = 0; i < pending.length; ) {
      const p = pending[i]!;
      if (p.at > clock) {
        i++;
        continue;
      }
      pending.splice(i, 1);
      core.submit({
        id: `${p.client}/${p.round}`,
        promptIds: w.prompt(p.client, p.round),
        maxTokens: w.outputTokens,
        naturalLength: Number.POSITIVE_INFINITY,
        nextToken: (k) => k,
        arrival: clock,
      });
    }
  };
  submitDue();
  for (;;) {
    const step = core.startStep();
    if (!step) {
      if (pending.length === 0) break;
      clock = Math.min(...pending.map((p) => p.at));
      submitDue();
      continue;
    }
    clock += step.seconds;
    for (const ev of core.finishStep(clock)) {
      if (ev.kind !== "token") continue;
      tokens++;
      const seq = ev.seq;
      if (ev.index === 0) ttftSum += ev.at - seq.spec.arrival;
      else if (ev.prevAt !== undefined) {
        itlSum += ev.at - ev.prevAt;
        itlCount++;
      }
      if (ev.finished) {
        done++;
        e2eSum += ev.at - seq.spec.arrival;
        const [client, round] = seq.spec.id.split("/").map(Number) as [number, number];
        if (round + 1 < w.requestsPerClient) pending.push({ client, round: round + 1, at: clock + gap });
      }
    }
    submitDue();
  }
  return {
    requests: done,
    outputTokens: tokens,
    seconds: clock,
    outputTokensPerSecond: clock > 0 ? tokens / clock : 0,
    ttftMean: done > 0 ? ttftSum / done : 0,
    itlMean: itlCount > 0 ? itlSum / itlCount : 0,
    e2eMean: done > 0 ? e2eSum / done : 0,
  };
}

export interface TraceRequest {
  at: number;
  prompt: number[];
  outputTokens: number;
}

export interface TraceResult {
  outputTokens: number;
  /** From the first arrival to the last token. */
  seconds: number;
  ttftMean: number;
  itlMean: number;
}

/**
 * Open-loop replay: the requests arrive exactly when the trace says. The
 * benchmark records when its closed-loop clients really sent each request
 * and asks the model what those arrivals should have produced, so jitter
 * in the client does not count against the engine.
 */
export function replayTrace(cfg: EngineCoreConfig, trace: TraceRequest[]): TraceResult {
  const core = new EngineCore(cfg);
  const queue = [...trace].sort((a, b) => a.at - b.at);
  const t0 = queue[0]?.at ?? 0;
  let clock = t0;
  let next = 0;
  let ttftSum = 0;
  let itlSum = 0;
  let itlCount = 0;
  let tokens = 0;
  let done = 0;
  const submitDue = () => {
    for (; next < queue.length && queue[next]!.at <= clock; next++) {
      const r = queue[next]!;
      core.submit({
        id: String(next),
        promptIds: r.prompt,
        maxTokens: r.outputTokens,
        naturalLength: Number.POSITIVE_INFINITY,
        nextToken: (k) => k,
        arrival: r.at,
      });
    }
  };
  for (;;) {
    submitDue();
    const step = core.startStep();
    if (!step) {
      if (next >= queue.length) break;
      clock = queue[next]!.at;
      continue;
    }
    clock += step.seconds;
    for (const ev of core.finishStep(clock)) {
      if (ev.kind !== "token") continue;
      tokens++;
      if (ev.index === 0) ttftSum += ev.at - ev.seq.spec.arrival;
      else if (ev.prevAt !== undefined) {
        itlSum += ev.at - ev.prevAt;
        itlCount++;
      }
      if (ev.finished) done++;
    }
  }
  return {
    outputTokens: tokens,
    seconds: clock - t0,
    ttftMean: done > 0 ? ttftSum / done : 0,
    itlMean: itlCount > 0 ? itlSum / itlCount : 0,
  };
}
