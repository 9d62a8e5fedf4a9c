/**
 * Just enough of the Prometheus text exposition format for our own
 * /metrics endpoints: gauges and counters sampled at scrape time from the
 * objects that own the numbers, so nothing has to be kept in sync.
 */
export type Labels = Record<string, string>;
export interface Sample {
  labels?: Labels;
  value: number;
}

interface Family {
  name: string;
  help: string;
  type: "gauge" | "counter";
  collect: () => Sample[];
}

function escapeLabel(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

export class MetricsRegistry {
  private readonly families: Family[] = [];

  gauge(name: string, help: string, collect: () => Sample[] | number): void {
    this.families.push({ name, help, type: "gauge", collect: wrap(collect) });
  }

  counter(name: string, help: string, collect: () => Sample[] | number): void {
    this.families.push({ name, help, type: "counter", collect: wrap(collect) });
  }

  render(): string {
    const out: string[] = [];
    for (const f of this.families) {
      out.push(`# HELP ${f.name} ${f.help}`, `# TYPE ${f.name} ${f.type}`);
      for (const s of f.collect()) {
        const labels = s.labels
          ? `{${Object.entries(s.labels)
              .map(([k, v]) => `${k}="${escapeLabel(v)}"`)
              .join(",")}}`
          : "";
        out.push(`${f.name}${labels} ${Number.isFinite(s.value) ? s.value : 0}`);
      }
    }
    return `${out.join("\n")}\n`;
  }
}

function wrap(collect: () => Sample[] | number): () => Sample[] {
  return () => {
    const v = collect();
    return typeof v === "number" ? [{ value: v }] : v;
  };
}
