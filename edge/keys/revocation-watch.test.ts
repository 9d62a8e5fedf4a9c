import { describe, expect, it } from "vitest";
import { POLL_MS, RevocationWatch } from "./revocation-watch.ts";

describe("RevocationWatch", () => {
  it("polls at most every POLL_MS and accumulates revoked ids by epoch", async () => {
    let now = 0;
    const w = new RevocationWatch(() => now);
    expect(w.loaded).toBe(false);
    const asked: number[] = [];
    const log = [
      { epoch: 1, id: "k1" },
      { epoch: 2, id: "k2" },
    ];
    const since = async (e: number) => {
      asked.push(e);
      const rows = log.filter((r) => r.epoch > e);
      return { epoch: rows.at(-1)?.epoch ?? e, ids: rows.map((r) => r.id) };
    };
    await w.refresh(since);
    expect(w.loaded).toBe(true);
    expect(w.isRevoked("k2")).toBe(true);
    log.push({ epoch: 3, id: "k3" });
    now = POLL_MS - 1;
    expect(w.due()).toBe(false);
    await w.refresh(since);
    expect(w.isRevoked("k3")).toBe(false);
    now = POLL_MS;
    expect(w.due()).toBe(true);
    const polling = w.refresh(since);
    expect(w.due()).toBe(false); // one poll at a time
    await polling;
    expect(w.isRevoked("k3")).toBe(true);
    expect(asked).toEqual([0, 2]);
  });
});
