/**
 * Drives engine cores in real time: simulated time runs `speed` times faster
 * than the wall clock, a step's tokens are delivered when its simulated end
 * time is reached, and steps run back to back while there is work.
 *
 * Timers fire at ~1 ms granularity, so at high speed several steps fall due
 * per wake-up; they are applied in order with their own simulated end times,
 * so latencies seen by the model (and its histograms) stay exact while
 * delivery is bunched. If the process cannot keep up (CPU-bound at very
 * high speed), simulated time is slowed down rather than skipped: the model's
 * numbers stay right, the wall clock just gets less than `speed`, and
 * `llmgw_sim_lag_seconds_total` says by how much.
 */
import type { EngineCore, Step } from "./engine-core.ts";
import type { FinishReason, SeqEvent, SeqSpec } from "./scheduler.ts";

export interface TokenSink {
  onEvent(ev: SeqEvent): void;
}

interface Lane {
  core: EngineCore;
  clock: number;
  step: Step | undefined;
  end: number;
  timer: NodeJS.Timeout | undefined;
  scheduled: boolean;
  idle: boolean;
  /** Requests that arrived but join no step that started before their arrival. */
  inbox: SeqSpec[];
}

/** Work done per wake-up before yielding to I/O, in real milliseconds. */
const SLICE_MS = 8;
/** How early (real ms) a step may be delivered rather than sleeping once more. */
const EARLY_MS = 1;
/** How far (real ms) the simulation may fall behind before time is slowed instead. */
const MAX_LAG_MS = 20;

export class Runner {
  readonly speed: number;
  private readonly slowTokenSeconds: number;
  private readonly lanes: Lane[];
  private readonly sinks = new Map<string, { sink: TokenSink; lane: Lane }>();
  private anchorReal = performance.now();
  private anchorSim = 0;
  lagSeconds = 0;
  private stopped = false;

  constructor(
    cores: EngineCore[],
    speed: number,
    slowTokenMs: number,
    private readonly onSinkError: (err: unknown) => void = () => {},
  ) {
    this.speed = speed;
    this.slowTokenSeconds = (slowTokenMs / 1000) * speed;
    this.lanes = cores.map((core) => ({
      core,
      clock: 0,
      step: undefined,
      end: 0,
      timer: undefined,
      scheduled: false,
      idle: true,
      inbox: [],
    }));
  }

  simNow(): number {
    return this.anchorSim + ((performance.now() - this.anchorReal) / 1000) * this.speed;
  }

  get cores(): EngineCore[] {
    return this.lanes.map((l) => l.core);
  }

  /** Least-loaded core, like vLLM's data-parallel front end. */
  submit(spec: Omit<SeqSpec, "arrival">, sink: TokenSink, arrival = this.simNow()): void {
    this.submitGroup([{ spec, sink }], arrival);
  }

  private leastLoaded(): Lane {
    let lane = this.lanes[0]!;
    const load = (l: Lane) => l.core.load() + l.inbox.length;
    for (const l of this.lanes) if (load(l) < load(lane)) lane = l;
    return lane;
  }

  /** Sequences that must share a core (an `n > 1` request's choices share its prefix cache), each with its sink. */
  submitGroup(seqs: { spec: Omit<SeqSpec, "arrival">; sink: TokenSink }[], arrival = this.simNow()): void {
    const lane = this.leastLoaded();
    for (const { spec, sink } of seqs) {
      lane.inbox.push({ ...spec, arrival });
      this.sinks.set(spec.id, { sink, lane });
    }
    this.wake(lane);
  }

  cancel(id: string, reason: FinishReason): void {
    const entry = this.sinks.get(id);
    if (!entry) return;
    this.sinks.delete(id);
    const inbox = entry.lane.inbox;
    const queued = inbox.findIndex((s) => s.id === id);
    if (queued >= 0) {
      inbox.splice(queued, 1); // never reached the engine: nothing to count
      return;
    }
    entry.lane.core.cancel(id, reason, Math.max(entry.lane.clock, this.simNow()));
    this.wake(entry.lane);
  }

  stop(): void {
    this.stopped = true;
    for (const l of this.lanes) if (l.timer) clearTimeout(l.timer);
  }

  /** Moves arrived requests into the engine; busy, only those that arrived by the step's start. */
  private admit(lane: Lane, start: number, all: boolean): void {
    if (lane.inbox.length === 0) return;
    const keep: SeqSpec[] = [];
    for (const spec of lane.inbox) {
      if (all || spec.arrival <= start) lane.core.submit({ ...spec, arrival: Math.min(spec.arrival, start) });
      else keep.push(spec);
    }
    lane.inbox = keep;
  }

  private wake(lane: Lane): void {
    if (lane.scheduled || lane.timer || this.stopped) return;
    lane.scheduled = true;
    setImmediate(() => {
      lane.scheduled = false;
      this.run(lane);
    });
  }

  private run(lane: Lane): void {
    lane.timer = undefined;
    if (this.stopped) return;
    const sliceEnd = performance.now() + SLICE_MS;
    for (;;) {
      if (!lane.step) {
        const now = this.simNow();
        if (!lane.idle && now < lane.clock) {
          // The last step was delivered early; the next one starts at its simulated time and
          // takes the requests that have arrived by then, so plan it no sooner.
          const ms = ((lane.clock - now) / this.speed) * 1000;
          lane.timer = setTimeout(() => this.run(lane), Math.max(1, Math.floor(ms)));
          return;
        }
        // Back to back while busy; an idle GPU starts when the work arrives.
        const start = lane.idle ? Math.max(lane.clock, now) : lane.clock;
        this.admit(lane, start, lane.idle);
        const step = lane.core.startStep();
        if (!step) {
          if (!lane.idle && lane.inbox.length > 0) {
            lane.idle = true; // work arrived after this step would have started: start when it came
            continue;
          }
          lane.idle = true;
          return;
        }
        lane.idle = false;
        lane.step = step;
        lane.end = start + step.seconds + (step.samples ? this.slowTokenSeconds : 0);
      }
      const now = this.simNow();
      const ms = ((lane.end - now) / this.speed) * 1000;
      // Timers fire up to ~1 ms late; finishing a step up to 1 ms early instead of
      // sleeping again keeps delivery centred on the simulated time.
      if (ms > EARLY_MS) {
        lane.timer = setTimeout(() => this.run(lane), Math.max(1, Math.floor(ms - EARLY_MS)));
        return;
      }
      const behind = now - lane.end;
      if (behind > (MAX_LAG_MS / 1000) * this.speed) {
        this.lagSeconds += behind;
        this.anchorReal = performance.now();
        this.anchorSim = lane.end;
      }
      const events = lane.core.finishStep(lane.end);
      lane.clock = lane.end;
      lane.step = undefined;
      for (const ev of events) {
        const entry = this.sinks.get(ev.seq.spec.id);
        if (!entry) continue;
        if (ev.kind === "aborted" || ev.finished) this.sinks.delete(ev.seq.spec.id);
        try {
          entry.sink.onEvent(ev);
        } catch (err) {
          // One broken response must not stop the engine for everyone else.
          this.onSinkError(err);
        }
      }
      if (performance.now() > sliceEnd) {
        this.wake(lane);
        return;
      }
    }
  }
}
