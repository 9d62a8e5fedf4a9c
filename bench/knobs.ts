/**
 * A benchmark's settings from its environment (`ROUNDS=4 npm run bench:…`).
 * A value that is no number stops the run before anything starts, naming
 * the variable: `Number("4x")` would be NaN, and a run of NaN rounds
 * measures nothing while looking like it finished.
 */
export function numberKnob(name: string, fallback: number, min = 0): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  return checkedNumber(name, raw, min, "");
}

/** A comma-separated list of numbers, each checked as numberKnob checks one. */
export function numberListKnob(name: string, fallback: string): number[] {
  const raw = process.env[name]?.trim() || fallback;
  return raw.split(",").map((part) => checkedNumber(name, part, 0, ` in "${raw}"`));
}

/** `text` as a number of at least `min`, or the run stopped naming the variable (`where`: in which list). */
function checkedNumber(name: string, text: string, min: number, where: string): number {
  const v = Number(text);
  if (text.trim() === "" || !Number.isFinite(v) || v < min)
    stop(`${name}: "${text}"${where} is not a number of at least ${min}`);
  return v;
}

function stop(message: string): never {
  process.stderr.write(`bench: ${message}\n`);
  process.exit(2);
}

/** A JSON object, or `{}` when unset; anything else stops the run, naming the variable. */
export function objectKnob(name: string): Record<string, unknown> {
  const raw = process.env[name]?.trim();
  if (!raw) return {};
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {}
  if (typeof v !== "object" || v === null || Array.isArray(v)) stop(`${name}: "${raw}" is not a JSON object`);
  return v as Record<string, unknown>;
}
