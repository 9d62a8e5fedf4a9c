/**
 * Join tokens: secrets that let an agent enroll (get a client certificate)
 * a limited number of times before an expiry. Only the SHA-256 of each
 * secret is stored, in the same SQLite file as operator intent
 * (`data_dir/llmgw.db`, its own table), so a copy of the database does not
 * let anyone enroll.
 */
import { createHash, randomBytes } from "node:crypto";
import type { DatabaseSync } from "node:sqlite";
import { openDatabase } from "./sqlite.ts";

export type TokenCheck =
  | { ok: true; usesLeft: number; expiresAt: number; binding?: TokenBinding }
  | { ok: false; reason: "unknown" | "expired" | "used_up"; message: string };

export const MAX_TOKEN_USES = 10_000;

/**
 * A token made for one node name (`ctl tokens create --node NAME`); with
 * `replace`, enrolling revokes the certificates that name already holds.
 */
export interface TokenBinding {
  node: string;
  replace: boolean;
}

function hash(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

export class JoinTokenStore {
  private readonly db: DatabaseSync;

  constructor(path: string) {
    this.db = openDatabase(path);
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS join_tokens (
        hash TEXT PRIMARY KEY,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        uses_left INTEGER NOT NULL,
        last_used_at INTEGER,
        last_used_by TEXT
      );
    `);
    // Databases from before tokens could be bound to a name gain the columns.
    const columns = new Set(
      this.db
        .prepare("PRAGMA table_info(join_tokens)")
        .all()
        .map((c) => String(c.name)),
    );
    if (!columns.has("node")) this.db.exec("ALTER TABLE join_tokens ADD COLUMN node TEXT");
    if (!columns.has("replace_node"))
      this.db.exec("ALTER TABLE join_tokens ADD COLUMN replace_node INTEGER NOT NULL DEFAULT 0");
  }

  /**
   * A new secret (32 random bytes, hex: it never starts with "-", which a
   * command line would read as a flag). Only its hash is kept.
   */
  create(
    ttlMs: number,
    uses: number,
    now: number,
    binding?: TokenBinding,
  ): { secret: string; expiresAt: number } {
    if (!Number.isFinite(ttlMs) || ttlMs <= 0) throw new RangeError("ttl must be positive");
    if (!Number.isInteger(uses) || uses < 1 || uses > MAX_TOKEN_USES)
      throw new RangeError(`uses must be between 1 and ${MAX_TOKEN_USES}`);
    const secret = randomBytes(32).toString("hex");
    const expiresAt = now + ttlMs;
    this.db
      .prepare(
        "INSERT INTO join_tokens (hash, created_at, expires_at, uses_left, node, replace_node) VALUES (?, ?, ?, ?, ?, ?)",
      )
      .run(hash(secret), now, expiresAt, uses, binding?.node ?? null, binding?.replace ? 1 : 0);
    this.prune(now);
    return { secret, expiresAt };
  }

  /** Whether `secret` would be accepted now, without using it. */
  check(secret: string, now: number): TokenCheck {
    const row = this.db
      .prepare("SELECT expires_at, uses_left, node, replace_node FROM join_tokens WHERE hash = ?")
      .get(hash(secret));
    if (!row)
      return { ok: false, reason: "unknown", message: "the join token is not known to this control plane" };
    const expiresAt = Number(row.expires_at);
    const usesLeft = Number(row.uses_left);
    if (usesLeft <= 0)
      return { ok: false, reason: "used_up", message: "the join token has already been used up" };
    if (expiresAt <= now)
      return {
        ok: false,
        reason: "expired",
        message: `the join token expired at ${new Date(expiresAt).toISOString()}`,
      };
    const binding =
      row.node === null ? undefined : { node: String(row.node), replace: Number(row.replace_node) === 1 };
    return { ok: true, usesLeft, expiresAt, ...(binding ? { binding } : {}) };
  }

  /**
   * Uses `secret` once, atomically: of two enrollments racing for a token's
   * last use, exactly one wins.
   */
  consume(secret: string, now: number, by: string): TokenCheck {
    const r = this.db
      .prepare(
        "UPDATE join_tokens SET uses_left = uses_left - 1, last_used_at = ?, last_used_by = ? WHERE hash = ? AND uses_left > 0 AND expires_at > ?",
      )
      .run(now, by, hash(secret), now);
    if (Number(r.changes) === 1) {
      const c = this.check(secret, now);
      // The use just taken may have been the last one.
      return c.ok ? c : { ok: true, usesLeft: 0, expiresAt: now };
    }
    return this.check(secret, now);
  }

  /** Rows a day past expiry go: "expired" stays a precise answer for a while. */
  prune(now: number): void {
    this.db.prepare("DELETE FROM join_tokens WHERE expires_at < ?").run(now - 86_400_000);
  }

  close(): void {
    this.db.close();
  }
}
