/**
 * Every agent client certificate the control plane knows of — issued by
 * Enroll or renewal, or first seen on a stream (certificates enrolled before
 * this table existed) — with its node and, once revoked, when. Kept in
 * `data_dir/llmgw.db` beside the join tokens, so a revocation survives a
 * restart. A revoked serial is refused on the stream, by renewal and by
 * Enroll for as long as the certificate could be presented (until its
 * expiry; rows are pruned a day after).
 */
import { X509Certificate } from "node:crypto";
import type { DatabaseSync } from "node:sqlite";
import { openDatabase } from "./sqlite.ts";

export interface CertFacts {
  serial: string;
  node: string;
  notBefore: number;
  notAfter: number;
}

/** Serials as one spelling: lower-case hex without leading zeros (OpenSSL and @peculiar differ). */
export function normalizeSerial(hex: string): string {
  return hex.toLowerCase().replace(/^0+(?=.)/, "");
}

/** From a certificate as PEM, or as the DER a TLS socket reports. */
export function certFacts(cert: string | Buffer | X509Certificate): CertFacts {
  if (!(cert instanceof X509Certificate)) cert = new X509Certificate(cert);
  return {
    serial: normalizeSerial(cert.serialNumber),
    node: /(?:^|\n)CN=([^\n]*)/.exec(cert.subject)?.[1] ?? "",
    notBefore: Date.parse(cert.validFrom),
    notAfter: Date.parse(cert.validTo),
  };
}

export class CertificateStore {
  private readonly db: DatabaseSync;
  private readonly revoked = new Set<string>();

  constructor(path: string) {
    this.db = openDatabase(path);
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS agent_certificates (
        serial TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        not_before INTEGER NOT NULL,
        not_after INTEGER NOT NULL,
        revoked_at INTEGER
      );
      CREATE INDEX IF NOT EXISTS agent_certificates_node ON agent_certificates (node);
      CREATE TABLE IF NOT EXISTS agent_node_serials (
        node TEXT PRIMARY KEY,
        serial TEXT NOT NULL,
        bound_at INTEGER NOT NULL,
        renewed_serial TEXT
      );
    `);
    // A table made before renewals waited for their first use.
    const columns = this.db.prepare("PRAGMA table_info(agent_node_serials)").all();
    if (!columns.some((c) => c.name === "renewed_serial"))
      this.db.exec("ALTER TABLE agent_node_serials ADD COLUMN renewed_serial TEXT");
    for (const r of this.db
      .prepare("SELECT serial FROM agent_certificates WHERE revoked_at IS NOT NULL")
      .all())
      this.revoked.add(String(r.serial));
  }

  /** Records a certificate (issued now, or first seen); a known serial is left as it is. */
  note(c: CertFacts): void {
    this.db
      .prepare(
        "INSERT OR IGNORE INTO agent_certificates (serial, node, not_before, not_after) VALUES (?, ?, ?, ?)",
      )
      .run(normalizeSerial(c.serial), c.node, c.notBefore, c.notAfter);
  }

  isRevoked(serial: string): boolean {
    return this.revoked.has(normalizeSerial(serial));
  }

  /** Revokes every unexpired certificate of `node`; returns their serials. */
  revokeNode(node: string, now: number): string[] {
    const rows = this.db
      .prepare(
        "SELECT serial FROM agent_certificates WHERE node = ? AND revoked_at IS NULL AND not_after > ? ORDER BY not_before",
      )
      .all(node, now);
    const serials = rows.map((r) => String(r.serial));
    const mark = this.db.prepare("UPDATE agent_certificates SET revoked_at = ? WHERE serial = ?");
    for (const s of serials) {
      mark.run(now, s);
      this.revoked.add(s);
    }
    this.prune(now);
    return serials;
  }

  /** Serials of `node`'s certificates that could still be presented: unexpired and not revoked. */
  liveSerials(node: string, now: number): string[] {
    return this.db
      .prepare(
        "SELECT serial FROM agent_certificates WHERE node = ? AND revoked_at IS NULL AND not_after > ? ORDER BY not_before",
      )
      .all(node, now)
      .map((r) => String(r.serial));
  }

  /**
   * The serial on record for a node: the certificate it was last enrolled
   * or renewed with. Only that certificate may hold the node's stream, so a
   * second certificate for the name — however it was obtained — never
   * takes the node over.
   */
  boundSerial(node: string): string | undefined {
    const row = this.db.prepare("SELECT serial FROM agent_node_serials WHERE node = ?").get(node);
    return row ? String(row.serial) : undefined;
  }

  /** Records `cert` as the one its node speaks with from now on. */
  bind(cert: CertFacts, now: number): void {
    this.db
      .prepare(
        "INSERT INTO agent_node_serials (node, serial, bound_at, renewed_serial) VALUES (?, ?, ?, NULL) ON CONFLICT (node) DO UPDATE SET serial = excluded.serial, bound_at = excluded.bound_at, renewed_serial = NULL",
      )
      .run(cert.node, normalizeSerial(cert.serial), now);
  }

  /**
   * A renewal issued to the node with the certificate on record. The old one
   * keeps the node's stream until the new one is first used: an agent that
   * never got the answer (the stream broke, it could not save the file)
   * reconnects with the old one rather than being locked out of its name.
   */
  renewed(cert: CertFacts): void {
    this.db
      .prepare("UPDATE agent_node_serials SET renewed_serial = ? WHERE node = ?")
      .run(normalizeSerial(cert.serial), cert.node);
  }

  /**
   * A stream opened with `cert`: recorded, and bound when its node has no
   * serial on record yet (a node enrolled before the record existed) or
   * when it is the node's renewed certificate, used for the first time.
   * Returns the serial on record when it is another one: the stream is not
   * the node's.
   */
  claim(cert: CertFacts, now: number): string | undefined {
    this.note(cert);
    const row = this.db
      .prepare("SELECT serial, renewed_serial FROM agent_node_serials WHERE node = ?")
      .get(cert.node);
    const serial = normalizeSerial(cert.serial);
    if (!row || row.renewed_serial === serial) {
      this.bind(cert, now);
      return undefined;
    }
    return String(row.serial) === serial ? undefined : String(row.serial);
  }

  /**
   * Forgets every certificate: called when a new CA was created, since none
   * issued by the old one can be presented any more, and their names are
   * free to enroll again.
   */
  forgetAll(): number {
    const n = Number(this.db.prepare("DELETE FROM agent_certificates").run().changes);
    this.db.exec("DELETE FROM agent_node_serials");
    this.revoked.clear();
    return n;
  }

  /** Whether any certificate was ever recorded for `node`. */
  knows(node: string): boolean {
    return this.db.prepare("SELECT 1 FROM agent_certificates WHERE node = ? LIMIT 1").get(node) !== undefined;
  }

  /**
   * Nodes whose newest certificate is revoked — revoked and not enrolled
   * again since — with when. A node that enrolls again has a newer,
   * unrevoked certificate and drops out.
   */
  revokedNodes(): Map<string, number> {
    const rows = this.db
      .prepare(
        `SELECT c.node, c.revoked_at FROM agent_certificates c
         WHERE c.not_before = (SELECT MAX(not_before) FROM agent_certificates WHERE node = c.node)
           AND c.revoked_at IS NOT NULL`,
      )
      .all();
    return new Map(rows.map((r) => [String(r.node), Number(r.revoked_at)]));
  }

  /** Rows a day past expiry go: such a certificate cannot be presented any more. */
  prune(now: number): void {
    const gone = this.db
      .prepare("DELETE FROM agent_certificates WHERE not_after < ? RETURNING serial")
      .all(now - 86_400_000);
    for (const r of gone) this.revoked.delete(String(r.serial));
  }

  close(): void {
    this.db.close();
  }
}
