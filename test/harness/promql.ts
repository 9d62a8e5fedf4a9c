import type { SyntaxNode } from "@lezer/common";
import { parser } from "@prometheus-io/lezer-promql";

/**
 * PromQL read with Prometheus's own parser (the one its web UI uses), for
 * the tests that hold queries to docs/metrics.md: the alerting rules and
 * the Grafana dashboard.
 */
export interface Selector {
  metric: string;
  matchers: { label: string; op: string; value: string }[];
}

function children(n: SyntaxNode): SyntaxNode[] {
  const out: SyntaxNode[] = [];
  for (let c = n.firstChild; c; c = c.nextSibling) out.push(c);
  return out;
}

/** The expression's selectors, grouping labels and the labels its first aggregation keeps; or its syntax errors. */
export function readPromql(expr: string) {
  const tree = parser.parse(expr);
  const errors: string[] = [];
  const selectors: Selector[] = [];
  const grouping: string[] = [];
  let first: { by: string[] } | Selector | undefined;
  const text = (n: SyntaxNode) => expr.slice(n.from, n.to);
  tree.iterate({
    enter: (ref) => {
      const n = ref.node;
      if (n.type.isError) errors.push(`at ${n.from}: ${JSON.stringify(expr.slice(n.from, n.from + 20))}`);
      if (n.name === "VectorSelector") {
        const id = n.getChild("Identifier");
        const s: Selector = { metric: id ? text(id) : "", matchers: [] };
        for (const m of n.getChild("LabelMatchers")?.getChildren("UnquotedLabelMatcher") ?? []) {
          const [label, op, value] = children(m);
          s.matchers.push({ label: text(label!), op: text(op!), value: JSON.parse(text(value!)) as string });
        }
        selectors.push(s);
        first ??= s;
      }
      if (n.name === "GroupingLabels") {
        const labels = n.getChildren("LabelName").map(text);
        grouping.push(...labels);
        if (n.parent?.name === "AggregateModifier" && n.parent.firstChild?.name === "By")
          first ??= { by: labels };
      }
    },
  });
  return { errors, selectors, grouping, first };
}
