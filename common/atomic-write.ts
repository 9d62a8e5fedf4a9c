import { chmodSync, mkdirSync, renameSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

/**
 * Writes `data` to a temp file beside `path`, then renames it over `path`:
 * a crash mid-write leaves the previous version, never half a file. A
 * private file (0600) is private from the start; chmod after the write,
 * because a temp file left by a crash keeps its old mode.
 */
export function writeFileAtomic(path: string, data: string, mode = 0o644): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, data, { mode });
  chmodSync(tmp, mode);
  renameSync(tmp, path);
}
