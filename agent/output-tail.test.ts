import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { lastLines, readTail, trimLog } from "./output-tail.ts";

describe("output tail", () => {
  it("keeps the last non-empty lines and bounds long ones", () => {
    expect(lastLines("a\n\nb\r\nc\n", 2)).toEqual(["b", "c"]);
    expect(lastLines("partial\nwhole\n", 5, true)).toEqual(["whole"]);
    expect(lastLines("x".repeat(5000), 1)[0]).toHaveLength(2001);
  });

  it("reads the tail of a log file, and nothing for a missing one", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-tail-"));
    const path = join(dir, "e.log");
    writeFileSync(path, Array.from({ length: 200 }, (_, i) => `line ${i}`).join("\n"));
    const tail = await readTail(path, 50);
    expect(tail).toHaveLength(50);
    expect(tail[0]).toBe("line 150");
    expect(tail.at(-1)).toBe("line 199");
    expect(await readTail(join(dir, "missing.log"))).toEqual([]);
  });

  it("trims a log in place to its tail", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-tail-"));
    const path = join(dir, "e.log");
    writeFileSync(path, `${"old\n".repeat(1000)}newest\n`);
    expect(await trimLog(path, 100_000)).toBe(false);
    expect(await trimLog(path, 1_000, 100)).toBe(true);
    const text = readFileSync(path, "utf8");
    expect(text).toMatch(/^--- llmgw: .* log trimmed from 4007 bytes\n/);
    expect(text.endsWith("old\nnewest\n")).toBe(true);
    expect(text.length).toBeLessThan(200);
  });
});
