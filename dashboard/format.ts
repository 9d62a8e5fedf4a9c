import { safeLocale } from "./locale.ts";

/** `4s`, `3m 12s`, `2h 5m`: how long ago, or for how long. */
export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** Time since a Unix-millisecond stamp; "-" for none. */
export const since = (unixMs: bigint, now: number): string =>
  unixMs > 0n ? duration(now - Number(unixMs)) : "-";

export const gib = (mib: number | bigint): string => `${(Number(mib) / 1024).toFixed(1)}`;

export const percent = (fraction: number): string => `${Math.round(fraction * 100)}%`;

export const count = (n: number | bigint): string => Number(n).toLocaleString("en");

const CLOCK = new Intl.DateTimeFormat(safeLocale(navigator.languages), { timeStyle: "medium" });

/** The time of day of a Unix-millisecond stamp, in the browser's language where Intl accepts it. */
export const clock = (unixMs: number): string => CLOCK.format(unixMs);

const DAY = new Intl.DateTimeFormat(safeLocale(navigator.languages), {
  dateStyle: "medium",
  timeStyle: "short",
});

/** A date and time of a Unix-millisecond stamp, in the browser's language where Intl accepts it. */
export const day = (unixMs: number): string => DAY.format(unixMs);
