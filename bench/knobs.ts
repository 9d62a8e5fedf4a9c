/**
 * A benchmark's settings from its environment (`ROUNDS=4 npm run bench:…`).
 * A value that is no number stops the run before anything starts, naming
 * the variable: `Number("4x")` would be NaN, and a run of NaN rounds
 * measures nothing while looking like it finished.
 */
export function numberKnob(name: string, fallback: number, min = 0): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  const v = Number(raw);
  if (!Number.isFinite(v) || v < min) {
    process.stderr.write(`bench: ${name}: "${raw}" is not a number of at least ${min}\n`);
    process.exit(2);
  }
  return v;
}

/** A comma-separated list of numbers, each checked as numberKnob checks one. */
export function numberListKnob(name: string, fallback: string): number[] {
  const raw = process.env[name]?.trim() || fallback;
  return raw.split(",").map((part) => {
    const v = Number(part);
    if (part.trim() === "" || !Number.isFinite(v) || v < 0) {
      process.stderr.write(`bench: ${name}: "${part}" in "${raw}" is not a number of at least 0\n`);
      process.exit(2);
    }
    return v;
  });
}

/** A JSON object, or `{}` when unset; anything else stops the run, naming the variable. */
export function objectKnob(name: string): Record<string, unknown> {
  const raw = process.env[name]?.trim();
  if (!raw) return {};
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {}
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    process.stderr.write(`bench: ${name}: "${raw}" is not a JSON object\n`);
    process.exit(2);
  }
  return v as Record<string, unknown>;
}
