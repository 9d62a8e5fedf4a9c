import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { REPO } from "../../common/processes.ts";
import { documentedMetrics } from "../harness/prometheus.ts";
import { readPromql } from "../harness/promql.ts";

/**
 * infra/prometheus/alerts.yaml against what it alerts on: every
 * expression is PromQL Prometheus's own parser accepts, and names only
 * metrics, labels and label values docs/metrics.md lists (which
 * test/stack/operating.test.ts holds real processes' exports to), so a
 * renamed metric or a misspelt state cannot leave an alert that never
 * fires. docs/operating.md lists every alert.
 */
const FILE = join(REPO, "infra", "prometheus", "alerts.yaml");
// Not on a machine with only Node and npm; where Prometheus is installed, its rule engine runs the rules' own tests too.
const PROMTOOL = spawnSync("promtool", ["--version"]).status === 0;

const ruleSchema = z.strictObject({
  alert: z.string().regex(/^Llmgw[A-Z][A-Za-z]+$/),
  expr: z.string().min(1),
  for: z
    .string()
    .regex(/^\d+[smh]$/)
    .optional(),
  labels: z.strictObject({ severity: z.enum(["critical", "warning"]) }),
  annotations: z.strictObject({ summary: z.string().min(1), description: z.string().min(1) }),
});
const fileSchema = z.strictObject({
  groups: z.array(z.strictObject({ name: z.string().min(1), rules: z.array(ruleSchema).min(1) })).min(1),
});
type Rule = z.infer<typeof ruleSchema>;

const metrics = new Map(
  ["Control plane", "Agent"].flatMap((s) => documentedMetrics(s)).map((m) => [m.name, m]),
);
const metricsDoc = readFileSync(join(REPO, "docs", "metrics.md"), "utf8");
const SCRAPE_JOBS = [...metricsDoc.matchAll(/job_name: ([a-z-]+)/g)].map((m) => m[1]!);
/** What Prometheus adds to every scraped series. */
const TARGET_LABELS = ["job", "instance"];

/** Labels a selector's metric carries: the documented ones and the target's. */
function labelsOf(metric: string): string[] {
  return [...(metrics.get(metric)?.labels ?? []), ...TARGET_LABELS];
}

function problemsOf(rule: Rule): string[] {
  const { errors, selectors, grouping, first } = readPromql(rule.expr);
  if (errors.length > 0) return errors.map((e) => `not PromQL ${e}`);
  const out: string[] = [];
  for (const s of selectors) {
    if (s.metric !== "up" && !metrics.has(s.metric)) out.push(`${s.metric} is not in docs/metrics.md`);
    for (const m of s.matchers) {
      if (!labelsOf(s.metric).includes(m.label)) out.push(`${s.metric} has no label ${m.label}`);
      if (m.op !== "=" && m.op !== "=~") continue;
      for (const value of m.value.split("|")) {
        const known =
          m.label === "job"
            ? SCRAPE_JOBS.includes(value)
            : new RegExp(`(^|[^a-z_-])${value}([^a-z_-]|$)`).test(metrics.get(s.metric)?.meaning ?? "");
        if (!known) out.push(`${s.metric}{${m.label}="${value}"}: a value docs/metrics.md does not name`);
      }
    }
  }
  const used = new Set(selectors.flatMap((s) => labelsOf(s.metric)));
  for (const g of grouping) if (!used.has(g)) out.push(`groups by ${g}, which none of its metrics has`);
  // What the alert's series carry: the first aggregation's `by`, else the first selector's labels.
  const carried = first === undefined ? [] : "by" in first ? first.by : labelsOf(first.metric);
  const templates = Object.values(rule.annotations).join(" ");
  for (const [, label] of templates.matchAll(/\$labels\.([a-z_]+)/g)) {
    if (!carried.includes(label!))
      out.push(`its annotations read $labels.${label}, which its series do not carry`);
  }
  return out;
}

const rules = fileSchema.parse(parseYaml(readFileSync(FILE, "utf8"))).groups.flatMap((g) => g.rules);

describe("infra/prometheus/alerts.yaml", () => {
  it("has alerts for the control plane, the edge and the agents, each named once", () => {
    expect(rules.length).toBeGreaterThan(15);
    expect(new Set(rules.map((r) => r.alert)).size).toBe(rules.length);
    const names = new Set(rules.flatMap((r) => readPromql(r.expr).selectors.map((s) => s.metric)));
    for (const part of ["llmgw_nodes", "llmgw_edge_pool_up", "llmgw_agent_engines"])
      expect(names).toContain(part);
  });

  it.each(rules.map((r) => [r.alert, r] as const))(
    "%s reads only documented metrics, labels and values",
    (_, rule) => {
      expect(problemsOf(rule)).toEqual([]);
    },
  );

  it("would catch what it is for: bad PromQL, an unknown metric, label or value", () => {
    const base: Rule = { ...rules[0]!, annotations: { summary: "s", description: "d" } };
    const check = (expr: string, summary = "s") =>
      problemsOf({ ...base, expr, annotations: { summary, description: "d" } });
    expect(check("sum(rate(llmgw_nodes[5m])")[0]).toMatch(/^not PromQL/);
    expect(check("llmgw_node > 0")).toEqual(["llmgw_node is not in docs/metrics.md"]);
    expect(check('llmgw_nodes{phase="lost"} > 0')).toEqual(["llmgw_nodes has no label phase"]);
    expect(check('llmgw_agent_engines{state="failed"} > 0')).toEqual([
      'llmgw_agent_engines{state="failed"}: a value docs/metrics.md does not name',
    ]);
    expect(check('up{job="llmgw-cp"} == 0')).toEqual([
      'up{job="llmgw-cp"}: a value docs/metrics.md does not name',
    ]);
    expect(check("sum by (band) (llmgw_nodes) > 0")).toEqual([
      "groups by band, which none of its metrics has",
    ]);
    expect(check("sum by (state) (llmgw_nodes) > 0", "{{ $labels.instance }}")).toEqual([
      "its annotations read $labels.instance, which its series do not carry",
    ]);
  });

  it.skipIf(!PROMTOOL)("fire as alerts.test.yaml expects, in Prometheus's own rule engine (promtool)", () => {
    const r = spawnSync(
      "promtool",
      ["test", "rules", join(REPO, "infra", "prometheus", "alerts.test.yaml")],
      {
        encoding: "utf8",
      },
    );
    expect(r.status, `${r.stdout}${r.stderr}`).toBe(0);
  });

  it("docs/operating.md lists every alert, and no other", () => {
    const doc = readFileSync(join(REPO, "docs", "operating.md"), "utf8");
    const start = doc.indexOf("\n## Alerts\n");
    expect(start).toBeGreaterThan(0);
    const end = doc.indexOf("\n## ", start + 1);
    const section = doc.slice(start, end < 0 ? undefined : end);
    const listed = new Set([...section.matchAll(/^\| `(Llmgw[A-Za-z]+)`/gm)].map((m) => m[1]!));
    expect([...listed].sort()).toEqual(rules.map((r) => r.alert).sort());
  });
});
