import { DurableObject } from "cloudflare:workers";
import type { Env } from "./env.ts";

/**
 * Revocation that reaches every isolate within seconds, independent of KV
 * (whose changes can take a minute or more to reach other locations).
 *
 * RevocationLog is one Durable Object (a single global name) holding the
 * ordered list of revoked key ids. Each isolate asks it "what was revoked
 * after epoch N?" at most every POLL_MS, on the request path, so a revoked
 * key stops working everywhere within POLL_MS of the RevokeKey call. Keys
 * with limits are also refused by their own KeyLedger at admission, at once.
 */
export const POLL_MS = 2_000;
const LOG_NAME = "global";

export class RevocationLog extends DurableObject<Env> {
  private readonly sql: SqlStorage;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec(
      "CREATE TABLE IF NOT EXISTS revoked (epoch INTEGER PRIMARY KEY AUTOINCREMENT, key_id TEXT NOT NULL UNIQUE, at INTEGER NOT NULL)",
    );
  }

  async record(keyId: string): Promise<void> {
    this.sql.exec("INSERT OR IGNORE INTO revoked (key_id, at) VALUES (?, ?)", keyId, Date.now());
  }

  async since(epoch: number): Promise<{ epoch: number; ids: string[] }> {
    const rows = this.sql
      .exec<{ epoch: number; key_id: string }>(
        "SELECT epoch, key_id FROM revoked WHERE epoch > ? ORDER BY epoch",
        epoch,
      )
      .toArray();
    return { epoch: rows.at(-1)?.epoch ?? epoch, ids: rows.map((r) => r.key_id) };
  }
}

export function revocationLog(env: Env) {
  return env.REVOCATIONS.get(env.REVOCATIONS.idFromName(LOG_NAME));
}

/** The isolate's view of the log. */
export class RevocationWatch {
  private epoch = 0;
  private checkedAt = Number.NEGATIVE_INFINITY;
  private readonly revoked = new Set<string>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Brings the view up to date if it is older than POLL_MS (one call per isolate per interval). */
  async refresh(fetchSince: (epoch: number) => Promise<{ epoch: number; ids: string[] }>): Promise<void> {
    if (this.now() - this.checkedAt < POLL_MS) return;
    const r = await fetchSince(this.epoch);
    for (const id of r.ids) this.revoked.add(id);
    this.epoch = r.epoch;
    this.checkedAt = this.now();
  }

  /** Known at once in the isolate that handled the RevokeKey call. */
  add(keyId: string): void {
    this.revoked.add(keyId);
  }

  isRevoked(keyId: string): boolean {
    return this.revoked.has(keyId);
  }
}

export const revocationWatch = new RevocationWatch();
