import type { DatabaseSync } from "node:sqlite";
import { openDatabase } from "./sqlite.ts";

/**
 * Operator intent — cordons and drains — is the one thing the control plane
 * cannot rebuild from config and agents after a restart, so it lives in an
 * embedded SQLite file under `data_dir`. Everything else (nodes, replicas)
 * is rebuilt from agent registrations.
 */
export interface NodeIntentRecord {
  node: string;
  cordoned: boolean;
  draining: boolean;
  /** Unix ms; shards still there at this time are stopped regardless. */
  drainDeadline?: number;
  updatedAt: number;
}

export class IntentStore {
  private readonly db: DatabaseSync;
  private readonly cache = new Map<string, NodeIntentRecord>();

  constructor(path: string) {
    this.db = openDatabase(path);
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS node_intent (
        node TEXT PRIMARY KEY,
        cordoned INTEGER NOT NULL DEFAULT 0,
        draining INTEGER NOT NULL DEFAULT 0,
        drain_deadline INTEGER,
        updated_at INTEGER NOT NULL
      );
    `);
    const rows = this.db
      .prepare("SELECT node, cordoned, draining, drain_deadline, updated_at FROM node_intent")
      .all();
    for (const r of rows) {
      const rec: NodeIntentRecord = {
        node: String(r.node),
        cordoned: Number(r.cordoned) === 1,
        draining: Number(r.draining) === 1,
        updatedAt: Number(r.updated_at),
      };
      if (r.drain_deadline !== null) rec.drainDeadline = Number(r.drain_deadline);
      this.cache.set(rec.node, rec);
    }
  }

  get(node: string): NodeIntentRecord {
    return this.cache.get(node) ?? { node, cordoned: false, draining: false, updatedAt: 0 };
  }

  list(): NodeIntentRecord[] {
    return [...this.cache.values()];
  }

  cordon(node: string, now: number): NodeIntentRecord {
    return this.put({ ...this.get(node), cordoned: true, updatedAt: now });
  }

  /** Uncordon also ends a drain: the operator wants the node back in service. */
  uncordon(node: string, now: number): NodeIntentRecord {
    const { drainDeadline: _, ...rest } = this.get(node);
    return this.put({ ...rest, cordoned: false, draining: false, updatedAt: now });
  }

  /** A drained node is also cordoned, so nothing new lands on it meanwhile. */
  drain(node: string, deadline: number, now: number): NodeIntentRecord {
    return this.put({
      ...this.get(node),
      cordoned: true,
      draining: true,
      drainDeadline: deadline,
      updatedAt: now,
    });
  }

  close(): void {
    this.db.close();
  }

  private put(rec: NodeIntentRecord): NodeIntentRecord {
    this.db
      .prepare(
        `INSERT INTO node_intent (node, cordoned, draining, drain_deadline, updated_at) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT(node) DO UPDATE SET cordoned = excluded.cordoned, draining = excluded.draining,
           drain_deadline = excluded.drain_deadline, updated_at = excluded.updated_at`,
      )
      .run(rec.node, rec.cordoned ? 1 : 0, rec.draining ? 1 : 0, rec.drainDeadline ?? null, rec.updatedAt);
    this.cache.set(rec.node, rec);
    return rec;
  }
}
