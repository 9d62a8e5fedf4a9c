import { z } from "zod";

/**
 * Durations as operators write them: `500ms`, `15s`, `10m`, `1h30m`.
 * A bare number is refused on purpose: `15` could mean seconds or milliseconds,
 * and guessing wrong turns a 15 s timeout into 15 ms.
 */
const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const PART = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/y;

export function parseDuration(text: string): number {
  const s = text.trim();
  if (s === "0") return 0;
  if (s.length === 0) throw new Error("empty duration");
  let total = 0;
  PART.lastIndex = 0;
  while (PART.lastIndex < s.length) {
    const at = PART.lastIndex;
    const m = PART.exec(s);
    if (!m) throw new Error(`invalid duration "${text}" at "${s.slice(at)}" (use e.g. 500ms, 15s, 10m, 1h)`);
    total += Number(m[1]) * UNIT_MS[m[2]!]!;
  }
  return Math.round(total);
}

export function formatDuration(ms: number): string {
  if (ms === 0) return "0s";
  if (ms % 86_400_000 === 0) return `${ms / 86_400_000}d`;
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms % 1_000 === 0) return `${ms / 1_000}s`;
  return `${ms}ms`;
}

/** A duration field of a config schema: written as a string, parsed to milliseconds. */
export const durationSchema = z
  .string({
    error: (issue) =>
      typeof issue.input === "number"
        ? `a duration needs a unit: "${issue.input}s", "${issue.input}m" or "${issue.input}ms" (a bare ${issue.input} could mean seconds or milliseconds)`
        : undefined,
  })
  .transform((s, ctx) => {
    try {
      return parseDuration(s);
    } catch (err) {
      ctx.addIssue({ code: "custom", message: (err as Error).message });
      return z.NEVER;
    }
  });

/**
 * A duration field that must lie within [min, max], both written as
 * durations. Zero where a timer or loop needs a period spins; past about
 * 24.8 days Node's timers overflow and fire at once. So every field that
 * drives a timer states its range, and the message names it.
 */
export function durationWithin(min: string, max: string) {
  const lo = parseDuration(min);
  const hi = parseDuration(max);
  return durationSchema.refine((ms) => ms >= lo && ms <= hi, `must be between ${min} and ${max}`);
}

/** The same check for a command-line flag: the value, or an error naming the flag and the range. */
export function checkWithin(ms: number, flag: string, min: string, max: string): number {
  if (ms < parseDuration(min) || ms > parseDuration(max))
    throw new Error(`${flag}: must be between ${min} and ${max}`);
  return ms;
}
