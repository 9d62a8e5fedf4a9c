/**
 * The Prometheus text exposition format as engines export it, read: every
 * sample line into a name, labels and a value. Pure and forgiving line by
 * line (a malformed line is skipped and counted, the rest still counts),
 * bounded in what it accepts, and knows nothing about HTTP. HELP and TYPE
 * lines are skipped; what is read is the samples. The agent reads its
 * engines' load with it, the control plane its static endpoints' capacity.
 */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface ParseResult {
  samples: Sample[];
  /** "line N: why", at most MAX_ERRORS of them. */
  errors: string[];
}

const MAX_ERRORS = 20;
export const MAX_METRICS_BYTES = 4 * 1024 * 1024;
const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;

function parseValue(text: string): number | undefined {
  switch (text) {
    case "NaN":
      return Number.NaN;
    case "+Inf":
    case "Inf":
      return Number.POSITIVE_INFINITY;
    case "-Inf":
      return Number.NEGATIVE_INFINITY;
  }
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) return undefined;
  return Number(text);
}

/** Parses one sample line; throws a short reason on malformed input. */
function parseLine(line: string): Sample {
  const m = NAME.exec(line);
  if (!m) throw new Error("no metric name");
  const name = m[0];
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === "{") {
    i++;
    for (;;) {
      while (line[i] === " ") i++;
      if (line[i] === "}") {
        i++;
        break;
      }
      const ln = LABEL_NAME.exec(line.slice(i));
      if (!ln) throw new Error("bad label name");
      i += ln[0].length;
      if (line[i] !== "=" || line[i + 1] !== '"') throw new Error(`label ${ln[0]} has no quoted value`);
      i += 2;
      let value = "";
      for (;;) {
        const c = line[i];
        if (c === undefined) throw new Error("unterminated label value");
        if (c === '"') break;
        if (c === "\\") {
          const e = line[i + 1];
          value += e === "n" ? "\n" : (e ?? "");
          i += 2;
          continue;
        }
        value += c;
        i++;
      }
      i++;
      labels[ln[0]] = value;
      while (line[i] === " ") i++;
      if (line[i] === ",") i++;
      else if (line[i] !== "}") throw new Error("expected , or } after label");
    }
  }
  if (line[i] !== " " && line[i] !== "\t") throw new Error("expected a space before the value");
  const rest = line.slice(i).trim().split(/\s+/);
  if (rest.length < 1 || rest.length > 2 || !rest[0])
    throw new Error("expected a value and an optional timestamp");
  const value = parseValue(rest[0]);
  if (value === undefined) throw new Error(`bad value "${rest[0].slice(0, 40)}"`);
  return { name, labels, value };
}

export function parsePrometheusText(text: string, keep?: (name: string) => boolean): ParseResult {
  const samples: Sample[] = [];
  const errors: string[] = [];
  let errorCount = 0;
  const lines =
    text.length > MAX_METRICS_BYTES ? text.slice(0, MAX_METRICS_BYTES).split("\n") : text.split("\n");
  lines.forEach((raw, n) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    if (keep) {
      const m = NAME.exec(line);
      if (m && !keep(m[0])) return;
    }
    try {
      samples.push(parseLine(line));
    } catch (err) {
      errorCount++;
      if (errors.length < MAX_ERRORS) errors.push(`line ${n + 1}: ${(err as Error).message}`);
    }
  });
  if (errorCount > errors.length) errors.push(`… and ${errorCount - errors.length} more`);
  return { samples, errors };
}
