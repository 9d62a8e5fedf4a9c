import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tempDir } from "../test/harness/fleet.ts";
import { lockStateDir } from "./state-lock.ts";

describe("lockStateDir", () => {
  it("refuses a second holder while the first is alive, and takes over a stale lock", () => {
    const dir = tempDir("lock");
    const release = lockStateDir(dir);
    release();
    // A lock naming another live process (our parent) refuses.
    writeFileSync(join(dir, "agent.lock"), `${process.ppid}\n`);
    expect(() => lockStateDir(dir)).toThrow(new RegExp(`in use by another agent \\(pid ${process.ppid}\\)`));
    // A dead holder's lock is stale.
    writeFileSync(join(dir, "agent.lock"), "999999999\n");
    const again = lockStateDir(dir);
    again();
  });
});
