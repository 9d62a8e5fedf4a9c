/**
 * The repository's import graph and the rules it must keep (README, "Layout"):
 *
 * - nothing in agent/ or edge/ imports controlplane/ (the control plane may
 *   import the edge's schemas, never the other way round), and the agent and
 *   the control plane share only common/;
 * - in the edge, routing/ is the router's pure core: of the edge's folders it
 *   imports only config/ (the router settings' schema), never the shells that
 *   host it (pool/), proxy/, keys/ or sync/; EdgeSync (sync/) is a way in,
 *   mounted by app.ts, and no other folder of the edge imports it;
 * - the sim engine is its own program: it imports only common/;
 * - the dashboard is browser code: it imports only common/ and proto/, and
 *   no program imports it (the control plane serves its built bundle);
 * - common/ is below every program: it imports none of them (what two
 *   programs share moves down into it);
 * - no program's code imports test/ (its unit tests may use the fixtures and
 *   the harness): what `npm start`, `check:start` and the benchmarks share
 *   with the tests is in common/ or scripts/, and test/ re-exports it;
 * - loadgen/ does not import controlplane/ (the table renderer is common/);
 * - `llmgw ctl` (cli/ctl/) does not import controlplane/ or agent/: it talks
 *   to them over the wire, with what common/ and the edge's schemas share;
 *   nothing but scripts/ and tests imports cli/;
 * - no circle of imports, type-only ones included, outside generated code.
 *
 * Pure over a map of file → source text; `repoSources()` reads the tree.
 */
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";

const SKIP = new Set(["node_modules", ".git", ".wrangler", "dist", ".state", ".data"]);
const GENERATED = "proto/gen/";

/** Every .ts and .tsx file under `root` (repo-relative, `/`-separated) with its text; generated code left out. */
export function repoSources(root: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (SKIP.has(e.name)) continue;
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.tsx?$/.test(e.name) && !e.name.endsWith(".d.ts")) {
        const rel = relative(root, p).split("\\").join("/");
        if (!rel.startsWith(GENERATED)) out.set(rel, readFileSync(p, "utf8"));
      }
    }
  };
  walk(root);
  return out;
}

const SPECIFIER =
  /(?:^|[;\s])(?:import|export)\s[^;]*?from\s*["']([^"']+)["']|(?:^|[;\s])import\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/gm;

/** The relative imports of one file, resolved to repo-relative paths. */
export function importsOf(file: string, text: string): string[] {
  const out = new Set<string>();
  for (const m of text.matchAll(SPECIFIER)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (!spec?.startsWith(".")) continue;
    out.add(
      normalize(join(dirname(file), spec))
        .split("\\")
        .join("/"),
    );
  }
  return [...out];
}

export interface Violation {
  file: string;
  imports: string;
  rule: string;
}

interface Rule {
  from: string;
  to: string;
  rule: string;
  /** Whether the unit tests under `from` (`*.test.ts`) may import `to` anyway. */
  testsMay?: boolean;
}

const rule = (from: string, to: string): Rule => ({ from, to, rule: `${from} must not import ${to}` });

const isUnitTest = (file: string) => /\.test\.tsx?$/.test(file);

const FORBIDDEN: Rule[] = [
  rule("agent/", "controlplane/"),
  rule("edge/", "controlplane/"),
  ...["edge/pool/", "edge/proxy/", "edge/keys/", "edge/sync/"].map((to) => rule("edge/routing/", to)),
  ...["edge/config/", "edge/keys/", "edge/pool/", "edge/proxy/", "edge/routing/"].map((from) =>
    rule(from, "edge/sync/"),
  ),
  // The agent and the control plane share only common/.
  rule("controlplane/", "agent/"),
  // The sim engine is its own program: it shares only common/.
  ...["agent/", "controlplane/", "edge/", "loadgen/", "bench/", "test/"].map((to) => rule("sim-engine/", to)),
  // The dashboard runs in a browser: only pure shared code and the protocol.
  ...["agent/", "controlplane/", "edge/", "loadgen/", "sim-engine/", "bench/", "test/", "scripts/"].map(
    (to) => rule("dashboard/", to),
  ),
  ...["agent/", "controlplane/", "edge/", "loadgen/", "sim-engine/", "cli/"].map((from) =>
    rule(from, "dashboard/"),
  ),
  ...["agent/", "bench/", "bin/", "cli/", "common/", "controlplane/", "edge/", "loadgen/", "scripts/"].map(
    (from) => ({
      ...rule(from, "test/"),
      testsMay: true,
    }),
  ),
  rule("loadgen/", "controlplane/"),
  ...["agent/", "bench/", "controlplane/", "edge/", "loadgen/", "scripts/", "sim-engine/"].map((to) =>
    rule("common/", to),
  ),
  // ctl is a client: it reaches the control plane through ControlService and
  // the edge through EdgeSync, and shares with them only common/ and the
  // edge's schemas; its unit tests may build wire messages the server's way.
  ...["controlplane/", "agent/"].map((to) => ({ ...rule("cli/ctl/", to), testsMay: true })),
  // cli/ is the top: the one command loads each program, none loads it back.
  ...["agent/", "common/", "controlplane/", "dashboard/", "edge/", "loadgen/", "sim-engine/", "bench/"].map(
    (from) => rule(from, "cli/"),
  ),
];

export function violations(sources: ReadonlyMap<string, string>): Violation[] {
  const out: Violation[] = [];
  for (const [file, text] of sources) {
    for (const target of importsOf(file, text)) {
      for (const f of FORBIDDEN)
        if (file.startsWith(f.from) && target.startsWith(f.to) && !(f.testsMay && isUnitTest(file)))
          out.push({ file, imports: target, rule: f.rule });
    }
  }
  return out;
}

/** Every circle of imports among `sources`, each as the files around it (first file repeated at the end). */
export function cycles(sources: ReadonlyMap<string, string>): string[][] {
  const graph = new Map<string, string[]>();
  for (const [file, text] of sources)
    graph.set(
      file,
      importsOf(file, text).filter((t) => sources.has(t)),
    );
  // Tarjan's strongly connected components; a component of more than one file holds a circle.
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string) => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) !== idx.get(v)) return;
    const component: string[] = [];
    for (let w = stack.pop(); w !== undefined; w = stack.pop()) {
      onStack.delete(w);
      component.push(w);
      if (w === v) break;
    }
    const self = graph.get(v)?.includes(v);
    if (component.length > 1 || self) found.push(circleIn(component, graph));
  };
  for (const v of [...graph.keys()].sort()) if (!idx.has(v)) visit(v);
  return found;
}

/** The shortest circle through a strongly connected component's first file, for the error message. */
function circleIn(component: string[], graph: ReadonlyMap<string, string[]>): string[] {
  const inside = new Set(component);
  const start = [...component].sort()[0]!;
  const from = new Map<string, string>();
  const queue = [start];
  for (let i = 0; i < queue.length; i++) {
    const at = queue[i]!;
    for (const w of graph.get(at) ?? []) {
      if (!inside.has(w)) continue;
      if (w === start) {
        const path = [start];
        for (let v: string | undefined = at; v !== undefined && v !== start; v = from.get(v))
          path.splice(1, 0, v);
        return [...path, start];
      }
      if (!from.has(w)) {
        from.set(w, at);
        queue.push(w);
      }
    }
  }
  return [start, start];
}
