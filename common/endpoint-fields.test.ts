import { describe, expect, it } from "vitest";
import { spillGroupPriorityConflicts } from "./endpoint-fields.ts";

describe("spillGroupPriorityConflicts", () => {
  it("names every endpoint that gives its spill group a second priority; an unset pool is the default group", () => {
    expect(
      spillGroupPriorityConflicts([
        { pool: "h100", priority: 0 },
        { pool: "a100", priority: 1 },
        { pool: "h100", priority: 1 },
        { priority: 0 },
        { pool: "", priority: 2 },
        { pool: "a100", priority: 1 },
      ]),
    ).toEqual([
      { index: 2, message: 'spill group (pool) "h100" already has priority 0' },
      { index: 4, message: 'spill group (pool) "default" already has priority 0' },
    ]);
  });
});
