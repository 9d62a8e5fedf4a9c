import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO } from "../common/processes.ts";
import { varsIn, varsOf } from "./workerd.ts";

describe("varsOf: a wrangler.toml's [vars], as wrangler dev binds them", () => {
  it("reads the edge's wrangler.toml", () => {
    expect(varsOf(join(REPO, "wrangler.toml"))).toEqual({
      LLMGW_ROUTER: "{}",
      LLMGW_POOL_LOCATION: "",
      LLMGW_VPC_BINDING: "ONPREM",
    });
  });

  it("reads basic strings with escapes and literal strings, skips comments, and stops at the next table", () => {
    const toml = [
      'name = "x"',
      "[vars]",
      "# a comment",
      'A = "{\\"retries\\":2}"   # trailing comment',
      "B = 'C:\\path'",
      "",
      "[[kv_namespaces]]",
      'binding = "KV"',
    ].join("\n");
    expect(varsIn(toml, "t.toml")).toEqual({ A: '{"retries":2}', B: "C:\\path" });
  });

  it("has none without a [vars] table", () => {
    expect(varsIn('name = "x"\n', "t.toml")).toEqual({});
  });

  it("refuses what it cannot read rather than leave a var unbound", () => {
    expect(() => varsIn("[vars]\nN = 1\n", "t.toml")).toThrow('t.toml: [vars]: cannot read "N = 1"');
  });
});
