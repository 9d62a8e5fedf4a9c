import { describe, expect, it } from "vitest";
import { ApiError } from "../openai-errors.ts";
import { type KeyRecord, keyRecordSchema, modelAllowed, resolveBand } from "./rules.ts";

describe("key rules", () => {
  const bands = [
    { name: "platinum", priority: 400 },
    { name: "gold", priority: 300 },
    { name: "silver", priority: 200 },
    { name: "bronze", priority: 100 },
  ];
  const key = (over: Partial<KeyRecord> = {}): KeyRecord =>
    keyRecordSchema.parse({ id: "k", hash: "a".repeat(64), name: "n", max_band: "gold", ...over });
  it("chooses any band up to the key's, never above", () => {
    expect(resolveBand(key(), null, bands, "gold").name).toBe("gold");
    const asked = (value: string) => ({ header: "x-priority", value });
    expect(resolveBand(key(), asked("silver"), bands, "gold").name).toBe("silver");
    expect(() => resolveBand(key(), asked("platinum"), bands, "gold")).toThrow(ApiError);
    expect(() => resolveBand(key(), asked("nope"), bands, "gold")).toThrow(/Unknown band/);
    // The error names the header the band came in, as configured.
    for (const [value, code] of [
      ["nope", "invalid_band"],
      ["platinum", "band_not_allowed"],
    ]) {
      expect(() => resolveBand(key(), asked(value!), bands, "gold")).toThrow(
        expect.objectContaining({ code, param: "x-priority" }),
      );
    }
    // A router default above a bronze key is clamped, not refused.
    expect(resolveBand(key({ max_band: "bronze" }), null, bands, "gold").name).toBe("bronze");
    expect(resolveBand(key({ default_band: "silver" }), null, bands, "gold").name).toBe("silver");
    // Settings that dropped the key's band: a 403 that says so, not a 500.
    expect(() => resolveBand(key({ max_band: "diamond" }), null, bands, "gold")).toThrow(
      expect.objectContaining({ status: 403, code: "band_not_configured" }),
    );
  });
  it("limits models by canonical name or alias", () => {
    expect(modelAllowed(key(), "a", "a")).toBe(true);
    expect(modelAllowed(key({ models: ["a"] }), "a", "alias-a")).toBe(true);
    expect(modelAllowed(key({ models: ["alias-a"] }), "a", "alias-a")).toBe(true);
    expect(modelAllowed(key({ models: ["b"] }), "a", "a")).toBe(false);
  });
});
