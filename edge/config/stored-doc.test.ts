import { afterEach, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { parseStored } from "./stored-doc.ts";

const doc = z.object({ version: z.number().int(), name: z.string() });

describe("a stored document", () => {
  const logged = vi.spyOn(console, "error").mockImplementation(() => {});
  afterEach(() => logged.mockClear());

  it("is what its schema makes of it, or absent when there is none", () => {
    expect(parseStored("config/a", '{"version":2,"name":"x"}', doc)).toEqual({ version: 2, name: "x" });
    expect(parseStored("config/a", null, doc)).toBeNull();
    expect(logged).not.toHaveBeenCalled();
  });

  it("that no longer parses reads as absent, reported by key and problem once per content", () => {
    const old = '{"version":"3","name":"x"}';
    expect(parseStored("config/b", old, doc)).toBeNull();
    expect(parseStored("config/b", old, doc)).toBeNull();
    expect(logged).toHaveBeenCalledTimes(1);
    expect(logged.mock.calls[0]![0]).toMatch(
      /^KV config\/b: stored document does not parse, read as absent: version: /,
    );
    expect(parseStored("config/b", "{not json", doc)).toBeNull();
    expect(logged).toHaveBeenCalledTimes(2);
    expect(logged.mock.calls[1]![0]).toContain("not JSON");
  });
});
