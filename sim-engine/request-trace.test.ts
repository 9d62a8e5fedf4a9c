import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readTrace } from "./request-trace.ts";

const rec = (user: string | null) =>
  JSON.stringify({
    user,
    request_id: null,
    arrived_ms: 1,
    first_token_ms: 2,
    ended_ms: 3,
    outcome: "finished",
  });

describe("a trace file", () => {
  const file = join(mkdtempSync(join(tmpdir(), "llmgw-trace-")), "t.jsonl");

  it("reads its records by user, leaving out a last line the engine had not finished", () => {
    writeFileSync(file, `${rec("a")}\n${rec(null)}\n${rec("b")}\n{"user":"c","arr`);
    expect([...readTrace(file).keys()]).toEqual(["a", "b"]);
  });

  it("names the file and line of a record that is not one", () => {
    writeFileSync(file, `${rec("a")}\nnot json\n${rec("b")}\n`);
    expect(() => readTrace(file)).toThrow(`${file}:2: not a trace record`);
  });
});
