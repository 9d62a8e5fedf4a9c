import { describe, expect, it } from "vitest";
import { MAX_ENGINE_KEY } from "../../common/static-endpoint.ts";
import { endpointRecordSchema, endpointSpec, RoutingTable } from "./catalog.ts";
import { unionOf } from "./site-sets.ts";

describe("routing table", () => {
  const ep = (id: string, models: string[]) => ({
    id,
    url: "http://x",
    models,
    pool: "default",
    weight: 1,
    priority: 0,
    via: "direct" as const,
  });
  it("knows catalog models, aliases and endpoint-only models, and resolves fallbacks", () => {
    const t = new RoutingTable(
      {
        version: 1,
        models: [
          { name: "big", aliases: ["b"], fallbacks: ["small", "gone"], routing: "" },
          { name: "small", aliases: [], fallbacks: [], routing: "" },
        ],
      },
      { version: 1, endpoints: [ep("e1", ["small"]), ep("e2", ["handrun"])] },
    );
    expect(t.resolve("b")).toBe("big");
    expect(t.resolve("handrun")).toBe("handrun");
    expect(t.resolve("nope")).toBeUndefined();
    expect(t.chain("big")).toEqual(["big", "small"]);
    expect(t.modelNames()).toEqual(["big", "handrun", "small"]);
    expect(t.endpointsFor("small").map((e) => e.id)).toEqual(["e1"]);
  });
});

describe("engine keys", () => {
  const rec = (id: string, api_key?: string) =>
    endpointRecordSchema.parse({ id, url: "http://x", models: ["m"], ...(api_key ? { api_key } : {}) });

  it("are held by the endpoint's id in the union, a site's under its qualified id", () => {
    const sets = new Map([
      ["default", { version: 1, endpoints: [rec("s1", "key-default"), rec("open")] }],
      ["eu", { version: 2, endpoints: [rec("s1", "key-eu")] }],
    ]);
    const t = new RoutingTable({ version: 0, models: [] }, unionOf(sets));
    expect(t.engineKeyOf("s1")).toBe("key-default");
    expect(t.engineKeyOf("s1@eu")).toBe("key-eu");
    expect(t.engineKeyOf("open")).toBeUndefined();
    expect(t.engineKeyOf("gone")).toBeUndefined();
    expect([t.hasEndpoint("s1@eu"), t.hasEndpoint("open"), t.hasEndpoint("gone")]).toEqual([
      true,
      true,
      false,
    ]);
  });

  it("never enter the spec the pools hold and show", () => {
    const [e] = unionOf(new Map([["eu", { version: 1, endpoints: [rec("s1", "key-eu")] }]])).endpoints;
    const spec = endpointSpec(e!);
    expect(spec.id).toBe("s1@eu");
    expect(JSON.stringify(spec)).not.toContain("key-eu");
  });

  it("are refused empty, too long or with what a header cannot carry, without repeating the value", () => {
    for (const bad of ["", "a b", "tab\there", "é-key", "x".repeat(MAX_ENGINE_KEY + 1), "line\nbreak"]) {
      const r = endpointRecordSchema.safeParse({ id: "e", url: "http://x", models: ["m"], api_key: bad });
      expect(r.success, JSON.stringify(bad)).toBe(false);
      if (bad.length > 3) for (const i of r.error!.issues) expect(i.message).not.toContain(bad);
    }
    expect(rec("e", `llmgw-e-${"A".repeat(43)}`).api_key).toBe(`llmgw-e-${"A".repeat(43)}`);
    expect(rec("e", "~!#$%&'*+-.^_`|0Zz").api_key).toBe("~!#$%&'*+-.^_`|0Zz");
  });
});
