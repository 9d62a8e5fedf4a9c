import { describe, expect, it } from "vitest";
import { checkCatalogNames, modelNameSchema, type NamedModel } from "./catalog-names.ts";

const m = (name: string, aliases: string[] = [], fallbacks: string[] = []): NamedModel => ({
  name,
  aliases,
  fallbacks,
});

describe("checkCatalogNames", () => {
  it.each([
    {
      name: "distinct names, aliases and fallbacks",
      models: [m("a", ["x"], ["b"]), m("b", ["y"])],
      issues: [],
    },
    {
      name: "a name used twice",
      models: [m("a"), m("a")],
      issues: ['models[1].name: "a" is already the name of models[0]'],
    },
    {
      name: "an alias repeating its own name",
      models: [m("a", ["a"])],
      issues: [`models[0].aliases[0]: "a" repeats the model's own name`],
    },
    {
      name: "an alias listed twice",
      models: [m("a", ["x", "x"])],
      issues: ['models[0].aliases[1]: "x" is listed twice'],
    },
    {
      name: "an alias taken by another model",
      models: [m("a", ["x"]), m("b", ["x", "a"])],
      issues: [
        'models[1].aliases[0]: "x" is already an alias of models[0] (a)',
        'models[1].aliases[1]: "a" is already the name of models[0] (a)',
      ],
    },
    {
      name: "an unknown fallback",
      models: [m("a", [], ["nope"])],
      issues: ['models[0].fallbacks[0]: unknown model "nope"'],
    },
    {
      name: "a fallback to itself, by alias",
      models: [m("a", ["x"], ["x"])],
      issues: ['models[0].fallbacks[0]: "x" is this model itself'],
    },
    {
      name: "a cycle through an alias",
      models: [m("a", [], ["b"]), m("b", [], ["see"]), m("c", ["see"], ["a"])],
      issues: ["models[0].fallbacks: fallback cycle a → b → c → a"],
    },
    {
      name: "two cycles, each once",
      models: [m("a", [], ["b"]), m("b", [], ["a", "c"]), m("c", [], ["b"])],
      issues: [
        "models[0].fallbacks: fallback cycle a → b → a",
        "models[1].fallbacks: fallback cycle b → c → b",
      ],
    },
  ])("$name", ({ models, issues }) => {
    expect(checkCatalogNames(models).issues).toEqual(issues);
  });

  it("resolves names and aliases to their model", () => {
    const { canonical } = checkCatalogNames([m("a", ["x"]), m("b")]);
    expect([canonical("a"), canonical("x"), canonical("b"), canonical("nope")]).toEqual([0, 0, 1, undefined]);
  });
});

describe("modelNameSchema", () => {
  it.each(["llama-8b", "Qwen/Qwen2.5-7B", "org:model.v1_2"])("accepts %s", (n) => {
    expect(modelNameSchema.safeParse(n).success).toBe(true);
  });
  it.each(["", "-lead", "with space", "alpha\r\nx-llmgw-endpoint: evil"])("refuses %j", (n) => {
    expect(modelNameSchema.safeParse(n).error?.issues[0]?.message).toBe(
      "must be letters, digits and . _ : / -",
    );
  });
});
