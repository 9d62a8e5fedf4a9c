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

  it("rotate: new keys from then on, and the old ones told apart, also after a restart", () => {
    const path = db();
    const keys = openEngineKeys(path, 1);
    const old = keys.forReplica("m/p/0", 1);
    expect(keys.isRetired(old, "m/p/0", 1)).toBe(false);
    keys.rotate(2);
    const fresh = keys.forReplica("m/p/0", 1);
    expect(fresh).not.toBe(old);
    expect(keys.isRetired(old, "m/p/0", 1)).toBe(true);
    expect(keys.isRetired(fresh, "m/p/0", 1)).toBe(false);
    // A key that is neither (another database's, none at all) is not retired: nothing replaces its engine.
    expect(keys.isRetired("llmgw-e-from-elsewhere", "m/p/0", 1)).toBe(false);
    expect(keys.isRetired("", "m/p/0", 1)).toBe(false);
    keys.close();
    const again = openEngineKeys(path, 3);
    expect(again.forReplica("m/p/0", 1)).toBe(fresh);
    expect(again.isRetired(old, "m/p/0", 1)).toBe(true);
    again.rotate(4);
    expect(again.isRetired(old, "m/p/0", 1)).toBe(true);
    expect(again.isRetired(fresh, "m/p/0", 1)).toBe(true);
    again.close();
  });

  it("are derived from the secret and the replica alone", () => {
    const secret = new Uint8Array(32).fill(7);
    expect(engineKeyFor(secret, "m/p/0", 3)).toBe(engineKeyFor(new Uint8Array(32).fill(7), "m/p/0", 3));
    expect(engineKeyFor(secret, "m/p/0", 3)).not.toBe(engineKeyFor(new Uint8Array(32).fill(8), "m/p/0", 3));
  });
});
