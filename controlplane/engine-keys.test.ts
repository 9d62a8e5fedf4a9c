import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { engineKeyFor, openEngineKeys } from "./engine-keys.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const db = () => {
  const d = mkdtempSync(join(tmpdir(), "engine-keys-"));
  dirs.push(d);
  return join(d, "llmgw.db");
};

describe("engine keys", () => {
  it("are one per placement (replica and generation), printable, and the same after a restart on the same database", () => {
    const path = db();
    const first = openEngineKeys(path, 1);
    const a = first.forReplica("llama/p/0", 1);
    expect(first.forReplica("llama/p/1", 1)).not.toBe(a);
    // Placed again (its node lost, a gang restart): a new key, the old one dead with the old engine.
    expect(first.forReplica("llama/p/0", 2)).not.toBe(a);
    first.close();
    expect(a).toMatch(/^llmgw-e-[A-Za-z0-9_-]{43}$/);
    const again = openEngineKeys(path, 2);
    expect(again.forReplica("llama/p/0", 1)).toBe(a);
    again.close();
  });

  it("differ between control planes: each database makes its own secret", () => {
    const one = openEngineKeys(db(), 1);
    const two = openEngineKeys(db(), 1);
    expect(one.forReplica("m/p/0", 1)).not.toBe(two.forReplica("m/p/0", 1));
    one.close();
    two.close();
  });

  it("are derived from the secret and the replica alone", () => {
    const secret = new Uint8Array(32).fill(7);
    expect(engineKeyFor(secret, "m/p/0", 3)).toBe(engineKeyFor(new Uint8Array(32).fill(7), "m/p/0", 3));
    expect(engineKeyFor(secret, "m/p/0", 3)).not.toBe(engineKeyFor(new Uint8Array(32).fill(8), "m/p/0", 3));
  });
});
