/**
 * When an isolate's copy of something it read from KV (a key's record, the
 * edge's config) may be used. Until it is due, as it is. Past that, one
 * caller re-reads it while the others keep the copy: in the background,
 * going on with the copy, when that caller may (it can keep work alive past
 * itself, and the copy is worth serving) and the copy is at most
 * STALE_MAX_MS past due; otherwise before it goes on. Pure.
 */

// At most this long past due, so a KV that keeps failing is not hidden for ever.
export const STALE_MAX_MS = 60_000;

export type CopyUse = "use" | "use-and-reread" | "read-first";

export function copyUse(due: number, now: number, rereading: boolean, mayServeStale: boolean): CopyUse {
  if (now < due || rereading) return "use";
  return mayServeStale && now - due <= STALE_MAX_MS ? "use-and-reread" : "read-first";
}
