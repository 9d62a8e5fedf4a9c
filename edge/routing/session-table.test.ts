import { describe, expect, it } from "vitest";
import { SessionTable } from "./session-table.ts";

describe("SessionTable", () => {
  it("remembers a session's endpoint until it idles out", () => {
    const t = new SessionTable(10, 1_000);
    t.pin("s", "e1", 0);
    expect(t.get("s", 1_000)).toBe("e1");
    t.pin("s", "e2", 1_500);
    expect(t.get("s", 2_400)).toBe("e2");
    expect(t.get("s", 2_501)).toBeUndefined();
  });

  it("is bounded: past capacity the least recently pinned session goes", () => {
    const t = new SessionTable(2, 60_000);
    t.pin("a", "e", 0);
    t.pin("b", "e", 1);
    t.pin("a", "e", 2);
    t.pin("c", "e", 3);
    expect([t.get("a", 4), t.get("b", 4), t.get("c", 4)]).toEqual(["e", undefined, "e"]);
    expect(t.size).toBe(2);
  });

  it("forgets the sessions of an endpoint that left", () => {
    const t = new SessionTable();
    t.pin("a", "gone", 0);
    t.pin("b", "kept", 0);
    t.forget("gone");
    expect([t.get("a", 1), t.get("b", 1)]).toEqual([undefined, "kept"]);
  });
});
