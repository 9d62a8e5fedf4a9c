/**
 * When an agent dials its control plane again after losing it. Two things
 * pull against each other: every agent should be back within seconds of the
 * control plane's return (a late node's replicas are otherwise re-placed,
 * and on real GPUs that is minutes of weight loading), and a thousand agents
 * must not arrive in the same second and knock it over again.
 *
 * So the delay grows with full jitter from `baseMs` (a blip costs about a
 * second), but only up to a low ceiling, `maxMs`. Past the ramp — or as soon
 * as the control plane's requested spread is the wider window — an agent
 * retries once per window at a random phase: one uniform draw, then the
 * window itself. Fixed-period retries at independent phases put a fleet's
 * next attempts after any instant uniformly across one window, which is what
 * keeps every second of a reconnect storm under its share (full jitter on
 * every retry would bunch them in the first seconds: the expected residual
 * of a uniform delay is weighted toward short waits). A dead control plane
 * costs one refused connect per agent per window.
 */
export interface ReconnectScheduleOptions {
  baseMs: number;
  maxMs: number;
  random?: () => number;
}

export class ReconnectSchedule {
  private attempt = 0;
  /** The window the current phase was drawn for; retries repeat it while it holds. */
  private phasedWindow: number | undefined;

  constructor(private readonly opts: ReconnectScheduleOptions) {}

  /** The delay before the next attempt, given the spread the control plane asked for. */
  next(spreadMs: number): number {
    const ceiling = Math.min(this.opts.maxMs, this.opts.baseMs * 2 ** this.attempt);
    this.attempt++;
    const window = Math.max(ceiling, spreadMs);
    const random = this.opts.random ?? Math.random;
    if (window < this.opts.maxMs && spreadMs <= ceiling) return Math.floor(random() * ceiling);
    if (this.phasedWindow === window) return window;
    this.phasedWindow = window;
    return Math.floor(random() * window);
  }

  /** A stable session: the next loss starts from the ramp again. */
  reset(): void {
    this.attempt = 0;
    this.phasedWindow = undefined;
  }

  get attempts(): number {
    return this.attempt;
  }
}
