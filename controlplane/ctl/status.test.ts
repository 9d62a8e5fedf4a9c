import { describe, expect, it } from "vitest";
import { unplaced } from "./status.ts";

describe("unplaced", () => {
  it("keeps the explain blocks of replicas that are not placed, detail lines and all", () => {
    const lines = [
      "m/tp8/0 placed: rank 0 on a1 GPU 0-7 port 23001",
      "  why: bin-pack (score 1.00)",
      "m/tp8/1: 0/3 nodes can host m/tp8: 2 lost",
      "  needs: 8 GPUs",
      "  lost: a1, a2",
      "m/tp8/2: in backoff until 12:00",
      "  0/3 nodes can host m/tp8",
    ];
    expect(unplaced(lines)).toEqual(lines.slice(2));
    expect(unplaced(lines.slice(0, 2))).toEqual([]);
  });
});
