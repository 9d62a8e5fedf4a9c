import { readFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { parsePrometheusText } from "../../common/prometheus-text.ts";
import { REPO } from "./process.ts";

/**
 * The Prometheus text format read strictly, for tests: the sample
 * parser that reads engines' /metrics (common/) for the sample lines, and
 * the HELP and TYPE lines it skips, so a family's type is checked too.
 * Anything malformed throws.
 */
const metricType = z.enum(["counter", "gauge", "histogram", "summary", "untyped"]);
const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

export interface Family {
  name: string;
  type: z.output<typeof metricType>;
  help: string;
  samples: { labels: Record<string, string>; value: number }[];
}

export function parseExposition(text: string): Map<string, Family> {
  const families = new Map<string, Family>();
  const family = (name: string) => {
    let f = families.get(name);
    if (!f) {
      f = { name, type: "untyped", help: "", samples: [] };
      families.set(name, f);
    }
    return f;
  };
  for (const line of text.split("\n")) {
    const m = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
    if (!m) continue;
    const [, what, name, rest] = m as unknown as [string, "HELP" | "TYPE", string, string];
    if (!NAME.test(name)) throw new Error(`bad metric name in "${line}"`);
    if (what === "TYPE") {
      const f = family(name);
      if (f.samples.length > 0) throw new Error(`TYPE of ${name} after its samples`);
      f.type = metricType.parse(rest.trim());
    } else family(name).help = rest;
  }
  const { samples, errors } = parsePrometheusText(text);
  if (errors.length > 0) throw new Error(`malformed exposition: ${errors.join("; ")}`);
  for (const s of samples) {
    const f = families.get(s.name);
    if (!f) throw new Error(`sample ${s.name} has no TYPE line`);
    f.samples.push({ labels: s.labels, value: s.value });
  }
  return families;
}

/** The value of the first sample of `name` whose labels include `labels`; undefined when none. */
export function sampleValue(
  families: Map<string, Family>,
  name: string,
  labels: Record<string, string> = {},
): number | undefined {
  return families.get(name)?.samples.find((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    ?.value;
}

export interface DocumentedMetric {
  name: string;
  type: string;
  labels: string[];
  /** The row says the metric exists only under a condition ("Only with …"). */
  conditional: boolean;
  /** The row's meaning, which names the values its labels take. */
  meaning: string;
}

const rowSchema = z.tuple([z.string().regex(/^`[a-z_:]+`$/), metricType, z.string(), z.string().min(1)]);

/**
 * The metrics docs/metrics.md lists under `## heading` (its tables, up to
 * the next `## `): the contract the tests hold the exports to.
 */
export function documentedMetrics(heading: string): DocumentedMetric[] {
  const text = readFileSync(join(REPO, "docs", "metrics.md"), "utf8");
  const start = text.indexOf(`\n## ${heading}\n`);
  if (start < 0) throw new Error(`docs/metrics.md has no "## ${heading}"`);
  const end = text.indexOf("\n## ", start + 1);
  const section = text.slice(start, end < 0 ? undefined : end);
  const out: DocumentedMetric[] = [];
  for (const line of section.split("\n")) {
    if (!line.startsWith("| `")) continue;
    const cells = line
      .slice(1, -1)
      .split("|")
      .map((c) => c.trim());
    const [name, type, labels, meaning] = rowSchema.parse(cells);
    out.push({
      name: name.slice(1, -1),
      type,
      labels: labels === "" ? [] : labels.split(",").map((l) => l.trim().replace(/^`|`$/g, "")),
      conditional: meaning.includes("Only with"),
      meaning,
    });
  }
  return out;
}
