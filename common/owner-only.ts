import { chmodSync, existsSync, mkdirSync, statSync } from "node:fs";
import type { Logger } from "./log.ts";

/**
 * Secrets at rest — the CA key, join-token hashes, the database, engine
 * command lines — live in directories and files only their owner may read
 * (docs/security.md). What llmgw creates is created so; what it finds
 * looser (an older release, a umask, a copy) is tightened at start, and
 * what it cannot tighten is said in the log.
 */
const FORMAT = (mode: number) => `0${(mode & 0o777).toString(8)}`;

function tighten(path: string, want: number, log: Pick<Logger, "warn">): void {
  const mode = statSync(path).mode & 0o777;
  if ((mode & 0o077) === 0) return;
  try {
    chmodSync(path, mode & want);
  } catch (err) {
    log.warn("found readable by others and could not make it owner-only", {
      path,
      mode: FORMAT(mode),
      error: (err as Error).message,
    });
  }
}

/** `dir`, created if missing, readable by its owner only (0700). */
export function ownerOnlyDir(dir: string, log: Pick<Logger, "warn">): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  tighten(dir, 0o700, log);
}

/** Each of `files` that exists, readable by its owner only (0600). */
export function ownerOnlyFiles(files: readonly string[], log: Pick<Logger, "warn">): void {
  for (const f of files) if (existsSync(f)) tighten(f, 0o600, log);
}
