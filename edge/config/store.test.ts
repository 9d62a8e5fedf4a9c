import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { cachedEdgeConfig, type EdgeConfig, edgeConfig, invalidateEdgeConfig } from "./store.ts";

/** A KV with nothing stored that counts its reads; `gate` holds reads back until opened. */
function fakeKv() {
  let reads = 0;
  let gate: Promise<void> | undefined;
  const kv = {
    async get() {
      reads++;
      const held = gate;
      if (held) await held;
      return null;
    },
  } as unknown as KVNamespace;
  return {
    env: { LLMGW_KV: kv },
    reads: () => reads,
    /** Reads from now on wait; `let through` stops holding new ones, `open` releases those held. */
    hold(): { letThrough: () => void; open: () => void } {
      let open!: () => void;
      gate = new Promise((r) => {
        open = r;
      });
      return {
        letThrough: () => {
          gate = undefined;
        },
        open,
      };
    },
  };
}

/**
 * The isolate's copy of the edge's config, with the clock in the test's
 * hands: past its few seconds a request goes on with it while re-reading KV
 * in the background; only an isolate without a copy, a caller that cannot
 * keep work alive, or a copy long past waits for KV.
 */
describe("edgeConfig", () => {
  beforeEach(() => {
    vi.useFakeTimers();
    invalidateEdgeConfig();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("goes on with its copy past CACHE_MS while one caller re-reads KV in the background", async () => {
    const kv = fakeKv();
    const deferred: Promise<unknown>[] = [];
    const defer = (p: Promise<unknown>) => deferred.push(p);
    const first = edgeConfig(kv.env, defer);
    expect(first).toBeInstanceOf(Promise);
    const config = await first;
    const readsAfterFirst = kv.reads();
    vi.advanceTimersByTime(3_001);
    expect(edgeConfig(kv.env, defer)).toBe(config);
    expect(deferred).toHaveLength(1);
    // Another caller meanwhile: the same copy, no second read.
    expect(edgeConfig(kv.env, defer)).toBe(config);
    expect(deferred).toHaveLength(1);
    await deferred[0];
    expect(kv.reads()).toBeGreaterThan(readsAfterFirst);
    const fresh = edgeConfig(kv.env, defer) as EdgeConfig;
    expect(fresh).not.toBe(config);
    expect(deferred).toHaveLength(1);
  });

  it("waits for KV when the caller cannot defer, or the copy is long past", async () => {
    const kv = fakeKv();
    await edgeConfig(kv.env);
    vi.advanceTimersByTime(3_001);
    const undeferred = edgeConfig(kv.env);
    expect(undeferred).toBeInstanceOf(Promise);
    await undeferred;
    vi.advanceTimersByTime(3_000 + 60_001);
    expect(edgeConfig(kv.env, () => {})).toBeInstanceOf(Promise);
  });

  it("keeps the copy read after an invalidation over one a read begun before it made", async () => {
    const kv = fakeKv();
    await edgeConfig(kv.env);
    vi.advanceTimersByTime(3_001);
    const held = kv.hold();
    const deferred: Promise<unknown>[] = [];
    edgeConfig(kv.env, (p) => deferred.push(p));
    // EdgeSync wrote: the copy is dropped, and the next read sees the write.
    invalidateEdgeConfig();
    held.letThrough();
    const after = await edgeConfig(kv.env);
    // The read begun before the write ends last.
    held.open();
    await deferred[0];
    expect(cachedEdgeConfig()).toBe(after);
  });
});
