import { describe, expect, it } from "vitest";
import {
  StaticEndpointKeyError,
  staticEndpointIn,
  staticEndpointKeyIssues,
  staticEndpointSchema,
} from "./static-endpoint.ts";

const KEY = "llmgw-test-0123456789";
const parse = (e: Record<string, unknown>) =>
  staticEndpointSchema.parse({ url: "http://10.0.1.50:8000", models: ["m"], ...e });

describe("a static endpoint's api_key_env", () => {
  it("names a variable, never the key: anything but a variable's name is refused", () => {
    for (const bad of ["", "sk-live key", "LLMGW-KEY", "1KEY", "$LLMGW_KEY"]) {
      const r = staticEndpointSchema.safeParse({ id: "a", url: "http://h", models: ["m"], api_key_env: bad });
      expect(r.success, bad).toBe(false);
      expect(r.error!.issues[0]!.path).toEqual(["api_key_env"]);
    }
    expect(parse({ id: "a", api_key_env: "LLMGW_KEY_A" }).api_key_env).toBe("LLMGW_KEY_A");
  });

  it("is read from the environment it is given, into the endpoint EdgeSync carries", () => {
    const list = [parse({ id: "a", api_key_env: "LLMGW_KEY_A" }), parse({ id: "b" })];
    const [a, b] = list.map(staticEndpointIn({ LLMGW_KEY_A: KEY }));
    expect(a!.apiKey).toBe(KEY);
    expect(b!.apiKey).toBe("");
    expect(a!.id).toBe("a");
  });

  it("is an issue at its path when the variable is unset, empty, or holds no key a header can carry", () => {
    const list = [
      parse({ id: "a", api_key_env: "LLMGW_KEY_A" }),
      parse({ id: "b" }),
      parse({ id: "c", api_key_env: "LLMGW_KEY_C" }),
      parse({ id: "d", api_key_env: "LLMGW_KEY_D" }),
      parse({ id: "e", api_key_env: "LLMGW_KEY_E" }),
      parse({ id: "f", api_key_env: "toString" }),
    ];
    const env = { LLMGW_KEY_A: KEY, LLMGW_KEY_C: "", LLMGW_KEY_D: "has a space in-it" };
    const issues = staticEndpointKeyIssues(list, env);
    expect(issues.map((i) => `endpoints[${i.index}].${i.field}: ${i.message}`)).toEqual([
      "endpoints[2].api_key_env: LLMGW_KEY_C is not set",
      "endpoints[3].api_key_env: LLMGW_KEY_D: must be printable ASCII without spaces (it is sent in a header)",
      "endpoints[4].api_key_env: LLMGW_KEY_E is not set",
      "endpoints[5].api_key_env: toString is not set",
    ]);
    expect(JSON.stringify(issues)).not.toContain("in-it");
  });

  it("that holds no key stops the endpoint from being built, naming it and the variable", () => {
    const e = parse({ id: "h100-a", api_key_env: "LLMGW_KEY_A" });
    expect(() => staticEndpointIn({})(e)).toThrow(StaticEndpointKeyError);
    expect(() => staticEndpointIn({})(e)).toThrow('endpoint "h100-a": api_key_env: LLMGW_KEY_A is not set');
  });
});
