/**
 * The keys engines placed here require of whoever calls their API
 * (docs/security.md, "Engine keys"). Each placement of a replica (its id
 * and generation) gets its own, derived from one secret the control plane
 * keeps in its database: a key read off one node (its process list, its
 * agent's state) opens that engine and no other, and dies with it when the
 * replica is placed again (a lost or revoked node's replicas get new
 * generations elsewhere). The derivation needs no table of keys. It gives
 * the key an engine is launched with; what the edge is sent for a running
 * engine is the key its agent reports (Reconciler.launchedKey), so a
 * restarted control plane, even one with another secret, touches no engine.
 *
 * `rotate` makes a new secret for every placement from then on and keeps
 * the old one among the retired, only to tell which running engines still
 * require a key derived from it: the rollout replaces those (reconcile/
 * rollout.ts). A database that was lost has no retired secret, so its
 * engines are never replaced on that account.
 */
import { createHmac, randomBytes } from "node:crypto";
import { openDatabase } from "./sqlite.ts";

const SECRET_BYTES = 32;
// Names what the HMAC is for, so this secret could key something else one
// day without two uses ever yielding the same value.
const PURPOSE = "llmgw engine api key v1";
/** Answers kept for isRetired: a pass asks about every running engine. */
const MEMO_LIMIT = 20_000;

/** A replica's key: printable ASCII, since it goes into a header and an argv. */
export function engineKeyFor(secret: Uint8Array, replicaId: string, generation: number): string {
  const mac = createHmac("sha256", secret).update(`${PURPOSE}\0${replicaId}\0${generation}`);
  return `llmgw-e-${mac.digest("base64url")}`;
}

/** A placement's engine key: the replica and the generation it was launched as. */
export type EngineKeyOf = (replicaId: string, generation: number) => string;

/** Whether `key`, which a placement's engine was launched with, derives from a retired secret. */
export type RetiredKeyTest = (key: string, replicaId: string, generation: number) => boolean;

export interface EngineKeys {
  forReplica: EngineKeyOf;
  isRetired: RetiredKeyTest;
  /** A new secret for placements from now on; the current one is retired. */
  rotate(now: number): void;
  close(): void;
}

/** The control plane's engine keys, from the secrets in `db`, the current one made on the first start. */
export function openEngineKeys(path: string, now: number): EngineKeys {
  const db = openDatabase(path);
  // The current secret's table is the one the first release wrote.
  db.exec(`
    CREATE TABLE IF NOT EXISTS engine_key_secret (
      id INTEGER PRIMARY KEY CHECK (id = 1),
      secret BLOB NOT NULL,
      created_at_ms INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS engine_key_retired_secrets (
      secret BLOB PRIMARY KEY,
      retired_at_ms INTEGER NOT NULL
    );
  `);
  const write = (secret: Uint8Array, at: number) =>
    db
      .prepare(
        "INSERT INTO engine_key_secret (id, secret, created_at_ms) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET secret = excluded.secret, created_at_ms = excluded.created_at_ms",
      )
      .run(secret, at);
  const row = db.prepare("SELECT secret FROM engine_key_secret WHERE id = 1").get();
  let current = row ? new Uint8Array(row.secret as Uint8Array) : undefined;
  if (!current || current.byteLength < SECRET_BYTES) {
    current = new Uint8Array(randomBytes(SECRET_BYTES));
    write(current, now);
  }
  const retired = db
    .prepare("SELECT secret FROM engine_key_retired_secrets ORDER BY retired_at_ms")
    .all()
    .map((r) => new Uint8Array(r.secret as Uint8Array));
  const memo = new Map<string, boolean>();
  let held = current;
  return {
    forReplica: (replicaId, generation) => engineKeyFor(held, replicaId, generation),
    isRetired(key, replicaId, generation) {
      if (!key || retired.length === 0) return false;
      const at = `${replicaId}\0${generation}\0${key}`;
      let answer = memo.get(at);
      if (answer === undefined) {
        // The current secret's own keys are never retired, whatever the table says.
        answer =
          key !== engineKeyFor(held, replicaId, generation) &&
          retired.some((s) => engineKeyFor(s, replicaId, generation) === key);
        if (memo.size >= MEMO_LIMIT) memo.clear();
        memo.set(at, answer);
      }
      return answer;
    },
    rotate(at) {
      const next = new Uint8Array(randomBytes(SECRET_BYTES));
      db.exec("BEGIN IMMEDIATE");
      try {
        db.prepare(
          "INSERT OR IGNORE INTO engine_key_retired_secrets (secret, retired_at_ms) VALUES (?, ?)",
        ).run(held, at);
        write(next, at);
        db.exec("COMMIT");
      } catch (err) {
        db.exec("ROLLBACK");
        throw err;
      }
      retired.push(held);
      held = next;
      memo.clear();
    },
    close: () => db.close(),
  };
}
