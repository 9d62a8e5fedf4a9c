/**
 * What a key's ledger holds for requests it admitted whose charge has not
 * landed yet: one reservation per request, an upper bound on the tokens it
 * can use. Admission counts them (rate-window.ts), so a request that may
 * have crossed a budget or TPM limit is not overlooked just because its
 * charge is still on its way. Pure; the KeyLedger Durable Object keeps a
 * copy in SQLite.
 */

/** Completion tokens assumed for a request that names no max_tokens (it has no upper bound). */
export const OPEN_ENDED_COMPLETION_TOKENS = 4_096;

/**
 * How long a reservation outlives the router's `total` timeout: a request
 * ends within `total`, then its charge waits for its batch (charge-batcher)
 * and may be sent twice. A reservation still open after that belongs to a
 * Worker that died or a charge that failed, and stops counting.
 */
export const RESERVATION_GRACE_MS = 60_000;

export interface Reservation {
  /** The request id (the charge names it to close the reservation). */
  id: string;
  tokens: number;
  expiresAt: number;
}

/** What the Worker asks the ledger to hold for one request. */
export interface ReservationRequest {
  id: string;
  tokens: number;
  ttlMs: number;
}

/** A validated request body (request-schema.ts): only its size fields are read. */
type RequestBody = Readonly<Record<string, unknown>>;

function count(v: unknown): number | undefined {
  return typeof v === "number" ? v : undefined;
}

/**
 * An upper bound on a request's tokens: its body's size in bytes for the
 * prompt (a token is at least one byte of text, and the JSON around the
 * text is longer than a chat template's markers), plus n × max_tokens (or
 * max_completion_tokens, the larger if both), or n ×
 * OPEN_ENDED_COMPLETION_TOKENS without either — then it is an assumption,
 * not a bound. Embeddings generate nothing. A Responses API request comes
 * as the chat request it stands for (routing/conversation.ts).
 */
export function estimateTokens(body: RequestBody, bodyBytes: number, generates: boolean): number {
  if (!generates) return bodyBytes;
  // Engines differ on which wins when both are given (vLLM: a non-zero
  // max_completion_tokens); the larger is a bound either way.
  const named = [count(body.max_completion_tokens), count(body.max_tokens)].filter((v) => v !== undefined);
  const max = named.length > 0 ? Math.max(...named) : OPEN_ENDED_COMPLETION_TOKENS;
  return bodyBytes + (count(body.n) ?? 1) * max;
}

export function reservationFor(
  requestId: string,
  body: RequestBody,
  bodyBytes: number,
  generates: boolean,
  totalTimeoutMs: number,
): ReservationRequest {
  return {
    id: requestId,
    tokens: estimateTokens(body, bodyBytes, generates),
    ttlMs: totalTimeoutMs + RESERVATION_GRACE_MS,
  };
}

/** The open reservations of one key, with their sum kept as they come and go. */
export class OpenReservations {
  private readonly byId = new Map<string, Reservation>();
  private sum = 0;

  constructor(rows: Iterable<Reservation> = []) {
    for (const r of rows) this.open(r);
  }

  open(r: Reservation): void {
    this.close(r.id);
    this.byId.set(r.id, r);
    this.sum += r.tokens;
  }

  /** False when it was not open (already closed, expired, or never opened for this key). */
  close(id: string): boolean {
    const r = this.byId.get(id);
    if (!r) return false;
    this.byId.delete(id);
    this.sum -= r.tokens;
    return true;
  }

  /** Drops the reservations whose holder can no longer charge them; returns how many. */
  expire(now: number): number {
    let n = 0;
    for (const r of this.byId.values()) {
      if (r.expiresAt <= now) {
        this.close(r.id);
        n++;
      }
    }
    return n;
  }

  /** The tokens held for requests still running (or whose charge is on its way). */
  tokens(): number {
    return this.sum;
  }

  get size(): number {
    return this.byId.size;
  }

  /** When the next reservation expires, if any is open. */
  nextExpiry(): number | undefined {
    let next: number | undefined;
    for (const r of this.byId.values()) if (next === undefined || r.expiresAt < next) next = r.expiresAt;
    return next;
  }
}
