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
