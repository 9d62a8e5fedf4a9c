import { describe, expect, it, vi } from "vitest";
import { parseRouterSection, resolveSettings, SettingsError } from "./settings.ts";

describe("router settings", () => {
  it("a push that sets a retired key is refused, naming it", () => {
    expect(() => parseRouterSection({ timeouts: { dial: "5s" } })).toThrow(SettingsError);
    expect(() => parseRouterSection({ timeouts: { dial: "5s" } })).toThrow(/timeouts\.dial: not supported/);
  });

  it("a section stored by an earlier edge with a retired key still loads, the key dropped with one warning", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => {});
    try {
      const stored = { timeouts: { dial: "5s", idle: "7s" } };
      expect(resolveSettings(stored, undefined).timeouts.idle).toBe(7_000);
      expect(resolveSettings({ ...stored }, '{"timeouts":{"dial":"1s"}}').timeouts.idle).toBe(7_000);
      expect(warn).toHaveBeenCalledTimes(1);
      expect(warn.mock.calls[0]![0]).toContain("router.timeouts.dial: no longer supported, ignored");
    } finally {
      warn.mockRestore();
    }
  });

  it("anything else invalid in a stored section still fails, by path", () => {
    expect(() => resolveSettings({ timeouts: { idle: "soon" } }, undefined)).toThrow(/timeouts\.idle/);
  });
});
