/**
 * Per-phase deadlines for one attempt. Workers' fetch has no timeouts of its
 * own and does not expose connection establishment, so `dial` cannot be
 * told apart from waiting for headers: the header wait is bounded by
 * min(total, response_header) and a refused connection fails at once anyway.
 */
export type Phase = "dial" | "response_header" | "first_token" | "idle" | "total";

export class PhaseTimeout extends Error {
  constructor(
    readonly phase: Phase,
    readonly ms: number,
  ) {
    super(`${phase} timeout after ${ms} ms`);
  }
}

/**
 * Resolves like `p`, or rejects with PhaseTimeout after `ms` (calling
 * `onTimeout`, typically an abort, first). The timer is always cleared.
 */
export function withTimeout<T>(p: Promise<T>, ms: number, phase: Phase, onTimeout?: () => void): Promise<T> {
  if (!Number.isFinite(ms)) return p;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => {
        onTimeout?.();
        reject(new PhaseTimeout(phase, ms));
      },
      Math.max(0, ms),
    );
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

/** The tighter of a phase limit and what is left of the total, naming whichever binds. */
export function tighter(phase: Phase, phaseMs: number, totalDeadline: number, now: number): [number, Phase] {
  const left = totalDeadline - now;
  return left < phaseMs ? [left, "total"] : [phaseMs, phase];
}

/**
 * How long a stream waits for the engine's response headers, and the phase
 * to blame when they do not come. `first_token` runs from the attempt's
 * start, headers or not: a frozen engine (its kernel still accepts the
 * connection and the request) sends no headers either, and must be left
 * within `first_token` even when `response_header` is longer.
 */
export function headerWait(responseHeaderMs: number, firstTokenMs: number): [Phase, number] {
  return firstTokenMs < responseHeaderMs
    ? ["first_token", firstTokenMs]
    : ["response_header", responseHeaderMs];
}

/**
 * One timer per stream instead of one per read or per phase: `touch()` on
 * activity only records the time, `arm()` to a later deadline than the
 * pending check leaves that check be, and a check that finds time left
 * re-arms itself for what is left. So a stream's phases (header wait,
 * first token, idle) share one setTimeout, as long as the first check is
 * due no later than any phase to come could end: `firstCheckWithin` says
 * when that is. On expiry it calls `onFire` (which aborts the upstream, so
 * the pending read rejects) and remembers which phase ran out.
 */
export class Watchdog {
  fired: PhaseTimeout | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private due = Number.POSITIVE_INFINITY;
  private last = 0;
  private phase: Phase = "idle";
  private limit = Number.POSITIVE_INFINITY;
  private readonly created: number;

  constructor(
    private readonly totalDeadline: number,
    private readonly onFire: (t: PhaseTimeout) => void,
    private readonly now: () => number = Date.now,
    private readonly firstCheckWithin = Number.POSITIVE_INFINITY,
  ) {
    this.created = now();
  }

  /** Starts (or switches to) a phase: at most `ms` without activity from now. */
  arm(phase: Phase, ms: number): void {
    this.phase = phase;
    this.limit = ms;
    this.last = this.now();
    if (this.fired) return;
    if (this.timer === undefined) {
      this.schedule(Math.min(ms, this.firstCheckWithin));
    } else if (Math.min(this.last + ms, this.totalDeadline) < this.due) {
      this.schedule(ms);
    }
  }

  touch(): void {
    this.last = this.now();
  }

  stop(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    this.due = Number.POSITIVE_INFINITY;
  }

  private schedule(within: number): void {
    this.stop();
    const n = this.now();
    const wait = Math.max(0, Math.min(within - (n - this.last), this.totalDeadline - n));
    this.due = n + wait;
    this.timer = setTimeout(() => this.check(), wait);
  }

  private check(): void {
    this.timer = undefined;
    this.due = Number.POSITIVE_INFINITY;
    const n = this.now();
    if (n >= this.totalDeadline) this.fire(new PhaseTimeout("total", this.totalDeadline - this.created));
    else if (n - this.last >= this.limit) this.fire(new PhaseTimeout(this.phase, this.limit));
    else this.schedule(this.limit);
  }

  private fire(t: PhaseTimeout): void {
    if (this.fired) return;
    this.fired = t;
    this.onFire(t);
  }
}
