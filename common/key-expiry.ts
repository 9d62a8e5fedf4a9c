/**
 * When an API key stops working, as the edge, `llmgw keys` and the
 * dashboard each need to tell it: in ms since the epoch, 0 for never.
 */

/** The last instant of the year 9999: a later expiry is no date a client or a log can write. */
export const MAX_EXPIRY_MS = 253_402_300_799_999;

/** Whether the key has expired at `now` (a key with no expiry never does). */
export function expired(key: { expires_at_unix_ms: number }, now: number): boolean {
  return key.expires_at_unix_ms > 0 && now >= key.expires_at_unix_ms;
}
