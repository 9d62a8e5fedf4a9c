import { Code, ConnectError } from "@connectrpc/connect";

/** A request EdgeSync refuses, naming the field to fix (`endpoints[2].url: …`). */
export function invalid(message: string): ConnectError {
  return new ConnectError(message, Code.InvalidArgument);
}

/**
 * The version a document is written at: `requested` 0 means "stored + 1";
 * otherwise it must be newer than what is stored, so a restarted control
 * plane cannot roll the edge back with a stale push.
 */
export function nextVersion(current: number, requested: bigint): number {
  if (requested === 0n) return current + 1;
  const v = Number(requested);
  if (v <= current) {
    throw new ConnectError(
      `version ${v} is not newer than the stored version ${current}`,
      Code.FailedPrecondition,
    );
  }
  return v;
}
