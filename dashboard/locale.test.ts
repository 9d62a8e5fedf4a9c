import { describe, expect, it } from "vitest";
import { safeLocale } from "./locale.ts";

describe("safeLocale", () => {
  it.each([
    { languages: ["en-US"], locale: "en-US" },
    { languages: ["de-DE", "en-US"], locale: "de-DE" },
    // What headless Chromium reports under LANG=C.UTF-8.
    { languages: ["en-US@posix"], locale: "en-US" },
    { languages: ["en_GB.UTF-8@euro"], locale: "en-GB" },
    { languages: ["C.UTF-8", "fr-FR"], locale: "fr-FR" },
    { languages: ["C", "POSIX"], locale: "en-US" },
    { languages: ["!!", "x-"], locale: "en-US" },
    { languages: [], locale: "en-US" },
  ])("$languages → $locale", ({ languages, locale }) => {
    expect(safeLocale(languages)).toBe(locale);
    // Whatever it returns, formatting with it does not throw.
    expect(() => new Date(0).toLocaleTimeString(safeLocale(languages))).not.toThrow();
  });
});
