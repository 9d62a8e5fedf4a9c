/**
 * What a finished request is charged, and what one isolate sends its key's
 * ledger for many of them at once. Pure, so the Worker, the ledger and tests
 * share it.
 */
export interface ChargeInput {
  prompt_tokens: number;
  completion_tokens: number;
  /** The answer was cut short (client disconnect, engine failure). */
  partial: boolean;
  /** The token counts are the edge's estimate: the engine reported none (edge/proxy/usage-estimate.ts). */
  estimated?: boolean | undefined;
  /** The request's reservation in its key's ledger (its request id), for keys with limits. */
  reservation?: string | undefined;
}

/** What one isolate sends for a key at a time: its finished requests, summed (whole, non-negative counts). */
export interface ChargeBatch {
  /** Unique per batch; makes a retried call charge nothing twice. */
  id: string;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  partial_requests: number;
  /** Requests whose counts were estimates, and the tokens (prompt and completion) of theirs. */
  estimated_requests: number;
  estimated_tokens: number;
  /** The reservations these requests held (reservations.ts), closed with the charge. */
  closes: string[];
}

/** Sums finished requests into one batch (token counts as whole, non-negative numbers). */
export function sumCharges(id: string, items: readonly ChargeInput[]): ChargeBatch {
  const b: ChargeBatch = {
    id,
    requests: 0,
    prompt_tokens: 0,
    completion_tokens: 0,
    partial_requests: 0,
    estimated_requests: 0,
    estimated_tokens: 0,
    closes: [],
  };
  for (const c of items) {
    const prompt = Math.max(0, Math.floor(c.prompt_tokens));
    const completion = Math.max(0, Math.floor(c.completion_tokens));
    b.requests++;
    b.prompt_tokens += prompt;
    b.completion_tokens += completion;
    if (c.partial) b.partial_requests++;
    if (c.estimated) {
      b.estimated_requests++;
      b.estimated_tokens += prompt + completion;
    }
    if (c.reservation) b.closes.push(c.reservation);
  }
  return b;
}
