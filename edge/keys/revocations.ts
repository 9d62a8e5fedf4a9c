import { DurableObject } from "cloudflare:workers";

export { POLL_MS, RevocationWatch, revocationWatch } from "./revocation-watch.ts";

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
const LOG_NAME = "global";

/** Needs none of the Worker's bindings. */
export class RevocationLog extends DurableObject<object> {
  private readonly sql: SqlStorage;

  constructor(ctx: DurableObjectState, env: object) {
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

export function revocationLog(env: { REVOCATIONS: DurableObjectNamespace<RevocationLog> }) {
  return env.REVOCATIONS.get(env.REVOCATIONS.idFromName(LOG_NAME));
}
