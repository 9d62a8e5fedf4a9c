import { describe, expect, it, vi } from "vitest";
import { ChargeBatcher } from "./charge-batcher.ts";

describe("ChargeBatcher", () => {
  it("groups charges per key into one flush, and each caller waits for its batch", async () => {
    const flushed: [string, number[]][] = [];
    const b = new ChargeBatcher<number>(async (k, items) => {
      flushed.push([k, [...items]]);
    }, 5);
    await Promise.all([b.add("a", 1), b.add("a", 2), b.add("b", 3), b.add("a", 4)]);
    expect(flushed).toEqual([
      ["a", [1, 2, 4]],
      ["b", [3]],
    ]);
  });
  it("retries a failed flush once with the same batch id, then rejects", async () => {
    const ids: string[] = [];
    let n = 0;
    const ok = new ChargeBatcher<number>(
      async (_k, _items, id) => {
        ids.push(id);
        if (ids.length === 1) throw new Error("blip");
      },
      1,
      200,
      () => `batch-${++n}`,
    );
    await ok.add("a", 1);
    expect(ids).toEqual(["batch-1", "batch-1"]);
    await ok.add("a", 2);
    expect(ids.at(-1)).toBe("batch-2");
    const bad = new ChargeBatcher<number>(async () => {
      throw new Error("down");
    }, 1);
    await expect(bad.add("a", 1)).rejects.toThrow("down");
  });
});

describe("ChargeBatcher on Workers", () => {
  it("keeps a timer of each waiting caller's own until its batch is stored, and none after", async () => {
    vi.useFakeTimers();
    try {
      let store!: () => void;
      const b = new ChargeBatcher<number>(
        () =>
          new Promise<void>((r) => {
            store = r;
          }),
        10,
      );
      const waits = [b.add("a", 1), b.add("a", 2), b.add("a", 3)];
      // The batch's timer, and one per caller: a request whose only pending
      // work is another request's promise would be cancelled as hung.
      expect(vi.getTimerCount()).toBe(4);
      await vi.advanceTimersByTimeAsync(10);
      expect(vi.getTimerCount()).toBe(3);
      store();
      await Promise.all(waits);
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });

  it("fails a caller whose batch is never stored, instead of waiting forever", async () => {
    vi.useFakeTimers();
    try {
      const b = new ChargeBatcher<number>(() => new Promise<void>(() => {}), 10);
      const wait = b.add("a", 1);
      const failed = expect(wait).rejects.toThrow(/not stored within/);
      await vi.advanceTimersByTimeAsync(30_000);
      await failed;
    } finally {
      vi.useRealTimers();
    }
  });
});
