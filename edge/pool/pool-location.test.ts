import { describe, expect, it, vi } from "vitest";
import type { Env } from "../env.ts";
import { poolOf } from "./client.ts";

/** The options each pool was asked for with, from a namespace that only records them. */
function optionsFor(location: string | undefined): unknown {
  const ns = { idFromName: (n: string) => n, get: (_id: string, options?: unknown) => options };
  return poolOf({ MODEL_POOL: ns, LLMGW_POOL_LOCATION: location } as unknown as Env, "m");
}

describe("LLMGW_POOL_LOCATION", () => {
  it("passes a region on as the pool's location hint, and nothing when empty", () => {
    expect(optionsFor("weur")).toEqual({ locationHint: "weur" });
    expect(optionsFor("")).toBeUndefined();
    expect(optionsFor(undefined)).toBeUndefined();
  });

  it("passes no hint for a value that names no region, and says so once", () => {
    const logged = vi.spyOn(console, "error").mockImplementation(() => {});
    try {
      expect(optionsFor("weu")).toBeUndefined();
      expect(optionsFor("weu")).toBeUndefined();
      expect(logged).toHaveBeenCalledTimes(1);
      expect(logged.mock.calls[0]![0]).toContain('LLMGW_POOL_LOCATION: "weu" is not one of wnam, enam');
    } finally {
      logged.mockRestore();
    }
  });
});
