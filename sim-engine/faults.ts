/**
 * Fault injection, decided per generation request (chat or completions that
 * passed validation) in arrival order. Other engineers' failure tests depend
 * on these exact semantics (docs/sim-engine.md):
 *
 * - fail rate P: request k (0-based, counting every valid generation
 *   request) is answered 500 iff hash(seed, k) / 2^32 < P. Deterministic for
 *   a seed; P = 1 fails all, P = 0 none. A failed request is not "served".
 * - crash after N: the first N served requests complete normally; request
 *   N+1 gets its headers and first token, then the process exits with 70.
 * - hang after N: served requests after the first N hang — at first-token
 *   (headers only, for streams) or mid-stream (one token, then silence).
 */
import { mix32 } from "../common/rng.ts";

export type Fate = "fail" | "normal" | "crash" | "hang-first-token" | "hang-mid-stream";

export interface FaultOptions {
  seed: number;
  failRate: number;
  crashAfter?: number;
  hangAfter?: number;
  hangPhase: "first-token" | "mid-stream";
}

export class FaultPlan {
  private readonly opts: FaultOptions;
  private seen = 0;
  private served = 0;

  constructor(opts: FaultOptions) {
    this.opts = opts;
  }

  static failsAt(seed: number, k: number, rate: number): boolean {
    if (rate <= 0) return false;
    if (rate >= 1) return true;
    return mix32(mix32(seed >>> 0, 0x7f4a7c15), k) / 4294967296 < rate;
  }

  next(): Fate {
    const k = this.seen++;
    if (FaultPlan.failsAt(this.opts.seed, k, this.opts.failRate)) return "fail";
    const n = this.served++;
    if (this.opts.crashAfter !== undefined && n >= this.opts.crashAfter) return "crash";
    if (this.opts.hangAfter !== undefined && n >= this.opts.hangAfter) {
      return this.opts.hangPhase === "mid-stream" ? "hang-mid-stream" : "hang-first-token";
    }
    return "normal";
  }
}
