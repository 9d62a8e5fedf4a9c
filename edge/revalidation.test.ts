import { describe, expect, it } from "vitest";
import { type CopyUse, copyUse, STALE_MAX_MS } from "./revalidation.ts";

describe("copyUse", () => {
  it.each<[string, number, boolean, boolean, CopyUse]>([
    ["before it is due", 999, false, false, "use"],
    ["past due, while another caller re-reads it", 5_000, true, false, "use"],
    ["past due, re-read in the background", 5_000, false, true, "use-and-reread"],
    ["past due, by one that may not serve it stale", 5_000, false, false, "read-first"],
    ["at the stale bound", 1_000 + STALE_MAX_MS, false, true, "use-and-reread"],
    ["past the stale bound", 1_001 + STALE_MAX_MS, false, true, "read-first"],
  ])("%s", (_, now, rereading, mayServeStale, expected) => {
    expect(copyUse(1_000, now, rereading, mayServeStale)).toBe(expected);
  });
});
