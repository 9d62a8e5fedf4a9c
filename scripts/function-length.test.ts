import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { longFunctions } from "./function-length.ts";
import { repoSources } from "./import-graph.ts";

const REPO = join(import.meta.dirname, "..");

/**
 * Functions allowed over the limit for now, each with why. Remove an entry
 * when its function is split.
 */
const KNOWN: Record<string, string> = {};

describe("function length (house rule: none over ~100 lines)", () => {
  it("no function in the source folders is over 100 lines, tests aside", () => {
    const long = longFunctions(repoSources(REPO)).filter((f) => !(`${f.file} ${f.name}` in KNOWN));
    expect(long.map((f) => `${f.file}:${f.line} ${f.name} (${f.lines} lines)`)).toEqual([]);
  });
});

describe("the measure", () => {
  it("counts declarations, methods, arrows and nested closures from first line to last; test files aside", () => {
    const body = (n: number) => Array.from({ length: n }, (_, i) => `  const x${i} = ${i};`).join("\n");
    const files = new Map([
      ["a.ts", `export function long() {\n${body(4)}\n}\nfunction short() {\n${body(1)}\n}`],
      ["b.ts", `class C {\n  m() {\n${body(3)}\n  }\n}\nconst arrow = () => {\n${body(4)}\n};`],
      ["c.ts", `setTimeout(() => {\n${body(5)}\n});`],
      ["d.test.ts", `it("x", () => {\n${body(9)}\n});`],
    ]);
    expect(longFunctions(files, 4).map((f) => [f.file, f.line, f.name, f.lines])).toEqual([
      ["c.ts", 1, "(passed to setTimeout)", 7],
      ["a.ts", 1, "long", 6],
      ["b.ts", 8, "arrow", 6],
      ["b.ts", 2, "m", 5],
    ]);
  });
});
