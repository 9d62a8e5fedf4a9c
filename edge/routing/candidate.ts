/**
 * An endpoint as a picking stage sees it, and what a stage returns: the
 * words the picker (picker.ts) and its site stage (site-preference.ts) share.
 */
import type { BreakerState } from "./breaker.ts";
import type { EndpointSpec, LoadSample, Rejection } from "./types.ts";

export interface Candidate {
  spec: EndpointSpec;
  state: LoadSample["state"] | undefined;
  breaker: BreakerState;
  /** Half-open and its one probe already out. */
  probing: boolean;
  saturation: number;
  /** Requests in flight per unit of weight: what load is compared by. */
  pressure: number;
  /** When this endpoint was last picked (a decision counter): older first among equals. */
  lastPick: number;
}

export interface Filtered {
  kept: Candidate[];
  rejected: Rejection[];
}
