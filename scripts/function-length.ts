/**
 * The house rule that no function runs over ~100 lines (README, "Layout";
 * docs/architecture.md): every function, method, accessor and closure in
 * the repository's source measured from its first line to its last, nested
 * functions included. Unit tests (`*.test.ts`) are left out: a test reads
 * as one story. Pure over a map of file → source text, like import-graph.ts.
 */
import ts from "typescript";

export interface LongFunction {
  file: string;
  line: number;
  name: string;
  lines: number;
}

export const MAX_FUNCTION_LINES = 100;

/** What a function is called where it is declared: its name, the variable or property it is assigned to, or the call it is passed to. */
function nameOf(node: ts.FunctionLikeDeclaration, src: ts.SourceFile): string {
  if (node.name) return node.name.getText(src);
  const p = node.parent;
  if (ts.isVariableDeclaration(p) || ts.isPropertyAssignment(p) || ts.isPropertyDeclaration(p))
    return p.name.getText(src);
  if (ts.isCallExpression(p)) return `(passed to ${p.expression.getText(src).slice(0, 40)})`;
  return "(anonymous)";
}

/** Every function in `sources` longer than `max` lines, longest first; test files left out. */
export function longFunctions(
  sources: ReadonlyMap<string, string>,
  max = MAX_FUNCTION_LINES,
): LongFunction[] {
  const out: LongFunction[] = [];
  for (const [file, text] of sources) {
    if (/\.test\.tsx?$/.test(file)) continue;
    const src = ts.createSourceFile(
      file,
      text,
      ts.ScriptTarget.Latest,
      true,
      file.endsWith(".tsx") ? ts.ScriptKind.TSX : ts.ScriptKind.TS,
    );
    const visit = (node: ts.Node) => {
      if (ts.isFunctionLike(node) && "body" in node && node.body) {
        const first = src.getLineAndCharacterOfPosition(node.getStart(src)).line;
        const last = src.getLineAndCharacterOfPosition(node.getEnd()).line;
        const lines = last - first + 1;
        if (lines > max) out.push({ file, line: first + 1, name: nameOf(node, src), lines });
      }
      ts.forEachChild(node, visit);
    };
    visit(src);
  }
  return out.sort((a, b) => b.lines - a.lines);
}
