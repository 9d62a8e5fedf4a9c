import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tempDir } from "../test/harness/fleet.ts";
import { IntentStore } from "./intent-store.ts";

describe("IntentStore", () => {
  it("keeps cordons and drains across a reopen of the file", () => {
    const path = join(tempDir("intent"), "llmgw.db");
    const a = new IntentStore(path);
    a.cordon("n1", 1);
    a.drain("n2", 5_000, 2);
    a.cordon("n3", 3);
    a.uncordon("n3", 4);
    a.close();
    const b = new IntentStore(path);
    expect(b.get("n1")).toMatchObject({ cordoned: true, draining: false });
    expect(b.get("n2")).toMatchObject({ cordoned: true, draining: true, drainDeadline: 5_000 });
    expect(b.get("n3")).toMatchObject({ cordoned: false, draining: false });
    expect(b.get("n3").drainDeadline).toBeUndefined();
    expect(b.get("never-seen")).toMatchObject({ cordoned: false, draining: false });
    b.close();
  });
});
