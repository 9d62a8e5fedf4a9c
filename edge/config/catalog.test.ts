import { describe, expect, it } from "vitest";
import { RoutingTable } from "./catalog.ts";

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
