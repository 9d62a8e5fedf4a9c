/**
 * One per API key (named by the key id): the strongly consistent place for
 * what must not drift between edge locations — the revoked flag, RPM/TPM
 * windows, the budget, and durable usage totals.
 *
 * A thin shell: the rules are in rate-window.ts and reservations.ts.
 * Windows live in memory (if the object is evicted they restart empty,
 * which only ever errs toward admitting); totals, budget use, the revoked
 * flag, the set of charged batch ids and the open reservations are in
 * SQLite — a reservation must outlive an eviction during a long request,
 * or the next admission would not see it.
 */
import { DurableObject } from "cloudflare:workers";
import type { ChargeBatch } from "./charge.ts";
import {
  ADMIT_WAIT_MS,
  type AdmitResult,
  admit,
  type BudgetState,
  budgetPeriodStart,
  holdsReservations,
  type LedgerView,
  type RateLimits,
  rateLimitsOf,
  SlidingWindow,
  waitBeforeRetry,
} from "./rate-window.ts";
import { OpenReservations, type Reservation, type ReservationRequest } from "./reservations.ts";
import type { KeyLimits } from "./rules.ts";

export interface UsageTotals {
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  partial_requests: number;
  /** Requests charged the edge's estimate (the engine reported no usage), and their tokens. */
  estimated_requests: number;
  estimated_tokens: number;
  budget_used: number;
  budget_period_start: number;
  revoked: boolean;
}

/** An admission's answer, with where the key stands against its RPM and TPM after it (for the x-ratelimit-* headers). */
export type LedgerAnswer = AdmitResult & { rate?: RateLimits | undefined };

// Batch ids are kept this long to make charging idempotent across retries
// of the charge call itself; a batch cannot be retried later than this anyway.
const CHARGE_ID_RETENTION_MS = 24 * 3_600_000;

/** Needs none of the Worker's bindings. */
export class KeyLedger extends DurableObject<object> {
  private readonly sql: SqlStorage;
  private readonly requests = new SlidingWindow();
  private readonly tokens = new SlidingWindow();
  private readonly holds: OpenReservations;
  /** Admissions waiting for a reservation to close; woken in arrival order. */
  private readonly waiters = new Set<() => void>();
  private charges = 0;

  constructor(ctx: DurableObjectState, env: object) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(`
      CREATE TABLE IF NOT EXISTS charge_batches (id TEXT PRIMARY KEY, at INTEGER NOT NULL);
      CREATE TABLE IF NOT EXISTS totals (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
        partial_requests INTEGER NOT NULL, budget_period_start INTEGER NOT NULL, budget_used INTEGER NOT NULL,
        revoked INTEGER NOT NULL
      );
      INSERT OR IGNORE INTO totals VALUES (1, 0, 0, 0, 0, 0, 0, 0);
      -- Apart from totals so a ledger created before it gains it by this statement alone.
      CREATE TABLE IF NOT EXISTS estimated (
        id INTEGER PRIMARY KEY CHECK (id = 1), requests INTEGER NOT NULL, tokens INTEGER NOT NULL
      );
      INSERT OR IGNORE INTO estimated VALUES (1, 0, 0);
      CREATE TABLE IF NOT EXISTS reservations (
        id TEXT PRIMARY KEY, tokens INTEGER NOT NULL, expires_at INTEGER NOT NULL
      );
    `);
    this.holds = new OpenReservations(
      this.sql
        .exec("SELECT id, tokens, expires_at FROM reservations")
        .toArray()
        .map((r) => ({ id: String(r.id), tokens: Number(r.tokens), expiresAt: Number(r.expires_at) })),
    );
  }

  private row(): Record<string, number> {
    return this.sql.exec("SELECT * FROM totals WHERE id = 1").one() as Record<string, number>;
  }

  private budget(): BudgetState {
    const r = this.row();
    return { periodStart: r.budget_period_start!, used: r.budget_used! };
  }

  /**
   * Called before a request is sent anywhere; counts it against RPM when
   * admitted, and for TPM and budget keys holds `hold.tokens` until the
   * charge that names `hold.id` lands. When only what is running could
   * have reached a limit, waits (at most ADMIT_WAIT_MS) for charges and
   * decides again.
   */
  async admit(limits: KeyLimits, hold: ReservationRequest): Promise<LedgerAnswer> {
    const deadline = Date.now() + ADMIT_WAIT_MS;
    for (;;) {
      const now = Date.now();
      if (this.row().revoked) return { ok: false, reason: "revoked" };
      if (this.holds.expire(now) > 0) this.sql.exec("DELETE FROM reservations WHERE expires_at <= ?", now);
      const r = admit(limits, this.view(), now);
      if (r.ok) {
        this.requests.add(now, 1);
        if (holdsReservations(limits))
          this.reserve({ id: hold.id, tokens: hold.tokens, expiresAt: now + hold.ttlMs });
        return { ...r, rate: this.standing(limits, now) };
      }
      const wait = waitBeforeRetry(r, now, deadline, this.holds.nextExpiry());
      if (wait === undefined) return { ...r, rate: this.standing(limits, now) };
      await this.nextChange(wait);
    }
  }

  /** Where the key stands after the decision: the windows and reservations only, no budget row read. */
  private standing(limits: KeyLimits, now: number): RateLimits | undefined {
    return rateLimitsOf(
      limits,
      { requests: this.requests, tokens: this.tokens, reserved: this.holds.tokens() },
      now,
    );
  }

  private view(): LedgerView {
    return {
      requests: this.requests,
      tokens: this.tokens,
      budget: this.budget(),
      reserved: this.holds.tokens(),
      inFlight: this.holds.size,
    };
  }

  private reserve(r: Reservation): void {
    this.sql.exec(
      "INSERT OR REPLACE INTO reservations (id, tokens, expires_at) VALUES (?, ?, ?)",
      r.id,
      r.tokens,
      r.expiresAt,
    );
    this.holds.open(r);
  }

  /** Resolves when a reservation closes or after `ms`, whichever is first. */
  private nextChange(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.waiters.add(done);
    });
  }

  /**
   * Charges one batch of finished requests (charge-batcher.ts), once: a
   * second call with the same batch id is a no-op, so the caller may retry
   * the call safely. One row and one update per batch, however many
   * requests it holds; the batch also closes its requests' reservations.
   */
  async charge(batch: ChargeBatch, budgetPeriodMs: number): Promise<{ charged: boolean }> {
    const now = Date.now();
    let charged = false;
    this.ctx.storage.transactionSync(() => {
      const inserted = this.sql
        .exec(
          "INSERT INTO charge_batches (id, at) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING id",
          batch.id,
          now,
        )
        .toArray();
      if (inserted.length === 0) return;
      charged = true;
      // sumCharges made every count whole and non-negative.
      const { requests, prompt_tokens: prompt, completion_tokens: completion, partial_requests } = batch;
      const tokens = prompt + completion;
      const start = budgetPeriodStart(now, budgetPeriodMs);
      this.sql.exec(
        `UPDATE totals SET requests = requests + ?, prompt_tokens = prompt_tokens + ?,
           completion_tokens = completion_tokens + ?, partial_requests = partial_requests + ?,
           budget_used = CASE WHEN budget_period_start = ? THEN budget_used + ? ELSE ? END,
           budget_period_start = ?
         WHERE id = 1`,
        requests,
        prompt,
        completion,
        partial_requests,
        start,
        tokens,
        tokens,
        start,
      );
      if (batch.estimated_requests > 0) {
        this.sql.exec(
          "UPDATE estimated SET requests = requests + ?, tokens = tokens + ? WHERE id = 1",
          batch.estimated_requests,
          batch.estimated_tokens,
        );
      }
      this.tokens.add(now, tokens);
      if (batch.closes.length > 0) {
        this.sql.exec(
          "DELETE FROM reservations WHERE id IN (SELECT value FROM json_each(?))",
          JSON.stringify(batch.closes),
        );
      }
      if (++this.charges % 1000 === 0) {
        this.sql.exec("DELETE FROM charge_batches WHERE at < ?", now - CHARGE_ID_RETENTION_MS);
      }
    });
    if (!charged) return { charged };
    // Only once the transaction has committed, so memory never runs ahead of SQLite.
    for (const id of batch.closes) this.holds.close(id);
    for (const wake of [...this.waiters]) wake();
    return { charged };
  }

  async usage(): Promise<UsageTotals> {
    const r = this.row();
    const e = this.sql.exec("SELECT requests, tokens FROM estimated WHERE id = 1").one();
    return {
      requests: r.requests!,
      prompt_tokens: r.prompt_tokens!,
      completion_tokens: r.completion_tokens!,
      total_tokens: r.prompt_tokens! + r.completion_tokens!,
      partial_requests: r.partial_requests!,
      estimated_requests: Number(e.requests),
      estimated_tokens: Number(e.tokens),
      budget_used: r.budget_used!,
      budget_period_start: r.budget_period_start!,
      revoked: r.revoked === 1,
    };
  }

  /** Takes effect for the very next admission, wherever it comes from. */
  async revoke(): Promise<void> {
    this.sql.exec("UPDATE totals SET revoked = 1 WHERE id = 1");
    for (const wake of [...this.waiters]) wake();
  }
}
