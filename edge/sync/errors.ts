import { Code, ConnectError } from "@connectrpc/connect";

/** A request EdgeSync refuses, naming the field to fix (`endpoints[2].url: …`). */
export function invalid(message: string): ConnectError {
  return new ConnectError(message, Code.InvalidArgument);
}

/**
 * Versions are stored as JSON numbers, exact up to 2^53 - 1: a larger one
 * would be rounded, and its successor could not be sent back as a uint64.
 */
const MAX_VERSION = Number.MAX_SAFE_INTEGER;

/**
 * The version a document is written at: `requested` 0 means "stored + 1";
 * otherwise it must be newer than what is stored, so a restarted control
 * plane cannot roll the edge back with a stale push.
 */
export function nextVersion(current: number, requested: bigint): number {
  if (requested > BigInt(MAX_VERSION)) throw invalid(`version: at most ${MAX_VERSION}, got ${requested}`);
  if (requested === 0n) {
    if (current >= MAX_VERSION) {
      throw new ConnectError(
        `version: the stored version ${current} is the last there is`,
        Code.FailedPrecondition,
      );
    }
    return current + 1;
  }
  const v = Number(requested);
  if (v <= current) {
    throw new ConnectError(
      `version ${v} is not newer than the stored version ${current}`,
      Code.FailedPrecondition,
    );
  }
  return v;
}
