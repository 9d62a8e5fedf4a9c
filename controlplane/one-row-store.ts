import type { DatabaseSync, SQLInputValue } from "node:sqlite";
import { openDatabase } from "./sqlite.ts";

/**
 * One document kept in one row of a table of `data_dir/llmgw.db`, for state
 * a restarted control plane wants back as a whole (the known fleet, the
 * endpoint set last published): the row is replaced on every write, and
 * the caller encodes and validates the value.
 */
export interface OneRowTable {
  table: string;
  /** The value's column, and its SQLite type. */
  column: string;
  type: "TEXT" | "BLOB";
  /** The column holding the write's Unix ms. */
  writtenAt: string;
}

export class OneRowStore<V extends SQLInputValue> {
  private readonly db: DatabaseSync;

  constructor(
    path: string,
    private readonly t: OneRowTable,
  ) {
    this.db = openDatabase(path);
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS ${t.table} (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        ${t.column} ${t.type} NOT NULL,
        ${t.writtenAt} INTEGER NOT NULL
      );
    `);
  }

  /** Undefined when nothing was ever written. */
  read(): V | undefined {
    const row = this.db.prepare(`SELECT ${this.t.column} AS value FROM ${this.t.table} WHERE id = 1`).get();
    return row ? (row.value as V) : undefined;
  }

  write(value: V, now: number): void {
    const { table, column, writtenAt } = this.t;
    this.db
      .prepare(
        `INSERT INTO ${table} (id, ${column}, ${writtenAt}) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET ${column} = excluded.${column}, ${writtenAt} = excluded.${writtenAt}`,
      )
      .run(value, now);
  }

  close(): void {
    this.db.close();
  }
}
