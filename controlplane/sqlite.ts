import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync } from "node:sqlite";

/**
 * `data_dir/llmgw.db`, opened the way every store in it wants: its
 * directory made, write-ahead logging (the stores share the file, each on
 * its own connection) and a wait, rather than an error, while another
 * connection writes. `:memory:` for tests.
 */
export function openDatabase(path: string): DatabaseSync {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 2000;");
  return db;
}
