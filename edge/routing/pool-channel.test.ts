import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../config/router.ts";
import { plainEndpoint } from "./plain-endpoint.ts";
import {
  GRANT_NOTE_MS,
  GRANT_USE_MS,
  PoolCallLost,
  PoolChannel,
  RELEASE_RIDE_MS,
  type Timer,
} from "./pool-channel.ts";
import { PoolCore } from "./pool-core.ts";
import { PoolExchange } from "./pool-exchange.ts";
import type { AdmitRequest, Exchange, ExchangeAnswer } from "./pool-protocol.ts";

/**
 * A channel against a real PoolExchange and PoolCore, with the wire in the
 * test's hands: each call waits in `wire` until the test delivers it, and
 * the clock moves only when the test says. Without grants unless asked:
 * with them, a request after another may need no call at all.
 */
function rig(seqs = 1, grants = false) {
  const core = new PoolCore(
    "m",
    routerSchema.parse({
      admission: {
        bands: [{ name: "gold", priority: 1, saturation_ceiling: 1 }],
        default_band: "gold",
        grants,
      },
      scoring: { seq_ceiling: 1 },
    }),
    mulberry32(1),
  );
  core.setEndpoints(1, [plainEndpoint("e0", { capacity: { maxSeqs: seqs } })], 0);
  const desk = new PoolExchange(core);
  let clock = 0;
  const timers: { at: number; fire: () => void; cancelled: boolean }[] = [];
  const wire: { ex: Exchange; resolve: (a: ExchangeAnswer) => void; reject: (err: Error) => void }[] = [];
  const sent: Exchange[] = [];
  const channel = new PoolChannel({
    id: "iso",
    answerWithinMs: 2_000,
    pollHoldMs: 1_000,
    now: () => clock,
    timer: (ms): Timer => {
      const t = { at: clock + ms, fire: () => {}, cancelled: false };
      const fired = new Promise<void>((r) => {
        t.fire = r;
      });
      timers.push(t);
      return {
        fired,
        cancel: () => {
          t.cancelled = true;
        },
      };
    },
    send: (ex) => {
      sent.push(ex);
      return new Promise((resolve, reject) => wire.push({ ex, resolve, reject }));
    },
  });
  // A macrotask: every promise continuation the last step let run has run.
  const settle = () => new Promise<void>((r) => setTimeout(r, 0));
  return {
    core,
    channel,
    sent,
    wire,
    /**
     * Delivers the oldest call on the wire to the pool; its answer comes back
     * when the pool gives it, saying the pool is busy if `busy` says so.
     */
    async deliver(busy?: boolean) {
      const next = wire.shift();
      if (!next) throw new Error("nothing on the wire");
      desk.exchange(next.ex, clock, (a) => next.resolve(busy === undefined ? a : { ...a, busy }));
      await settle();
    },
    /** The oldest call on the wire fails at once, as a call to an overloaded pool does. */
    async fail() {
      const next = wire.shift();
      if (!next) throw new Error("nothing on the wire");
      next.reject(new Error("the pool is overloaded"));
      await settle();
    },
    async advance(ms: number) {
      clock += ms;
      for (const t of timers) if (!t.cancelled && t.at <= clock) t.fire();
      desk.tick(clock);
      await settle();
    },
    settle,
  };
}

type Rig = ReturnType<typeof rig>;

const req = (id: string, session?: string): AdmitRequest => ({
  id,
  band: "gold",
  key: "k",
  policy: "chat",
  prefix: [],
  ...(session ? { session } : {}),
});
const withPrefix = (r: AdmitRequest, ...prefix: number[]): AdmitRequest => ({ ...r, prefix });
const okReport = { attempts: [{ endpoint: "e0", verdict: "ok" as const }] };

describe("PoolChannel", () => {
  it("sends a lone admit at once, and what comes while a call is on its way rides in the next one", async () => {
    const r = rig(8);
    const first = r.channel.admit(req("r1"), 1);
    expect(r.sent).toHaveLength(1); // nothing waited for
    await r.deliver();
    expect((await first).ok).toBe(true);
    const second = r.channel.admit(req("r2"), 1);
    expect(r.sent).toHaveLength(2);
    // While r2's call is on its way: two admits and r1's release wait for it.
    const more = [r.channel.admit(req("r3"), 1), r.channel.admit(req("r4"), 1)];
    const released = r.channel.release("r1", okReport);
    await r.settle();
    expect(r.sent).toHaveLength(2);
    await r.deliver();
    expect((await second).ok).toBe(true);
    expect(r.sent).toHaveLength(3);
    expect(r.sent[2]!.admits.map((a) => a.id)).toEqual(["r3", "r4"]);
    expect(r.sent[2]!.releases.map((x) => x.id)).toEqual(["r1"]);
    await r.deliver();
    expect((await Promise.all(more)).every((a) => a.ok)).toBe(true);
    // A riding release's request is not woken when a call takes it: it finds it answered after its wait.
    await r.advance(RELEASE_RIDE_MS);
    await released;
    expect(r.channel.calls).toBe(3);
  });

  it("to a far pool that is not busy, an admit goes in a call of its own a quarter of the distance after the last", async () => {
    const r = rig(8);
    const first = r.channel.admit(req("r1"), 1);
    await r.advance(40); // the pool is 40 ms away
    await r.deliver();
    expect((await first).ok).toBe(true);
    const second = r.channel.admit(req("r2"), 1);
    await r.advance(1);
    const third = r.channel.admit(req("r3"), 1);
    const fourth = r.channel.admit(req("r4"), 1);
    await r.settle();
    expect(r.sent).toHaveLength(2); // r2's call left 1 ms ago: r3 and r4 wait for it a little
    await r.advance(9);
    expect(r.sent).toHaveLength(3); // 10 ms after r2's call, without its answer
    expect(r.sent[2]!.admits.map((a) => a.id)).toEqual(["r3", "r4"]);
    await r.deliver();
    await r.deliver();
    expect((await Promise.all([second, third, fourth])).every((a) => a.ok)).toBe(true);
  });

  it("to a far pool that says it is busy, or one near, admits wait for the call on its way as before", async () => {
    for (const [distance, busy] of [
      [40, true],
      [2, false],
    ] as const) {
      const r = rig(8);
      const first = r.channel.admit(req("r1"), 1);
      await r.advance(distance);
      await r.deliver(busy);
      expect((await first).ok).toBe(true);
      const second = r.channel.admit(req("r2"), 1);
      const third = r.channel.admit(req("r3"), 1);
      await r.advance(distance);
      expect(r.sent).toHaveLength(2);
      await r.deliver(busy);
      expect((await second).ok).toBe(true);
      expect(r.sent).toHaveLength(3);
      await r.deliver(busy);
      expect((await third).ok).toBe(true);
    }
  });

  it("sends a first-token note alone when nothing is on its way, and with the next call while one is", async () => {
    const r = rig(8);
    const first = r.channel.admit(req("r1"), 1);
    await r.deliver();
    expect((await first).ok).toBe(true);
    const noted = r.channel.prefilled("r1");
    expect(r.sent).toHaveLength(2);
    expect(r.sent[1]).toMatchObject({ admits: [], prefilled: ["r1"] });
    const second = r.channel.admit(req("r2"), 1); // an admit does not wait for a note's call
    expect(r.sent).toHaveLength(3);
    const again = r.channel.prefilled("r2");
    await r.settle();
    expect(r.sent).toHaveLength(3);
    await r.deliver();
    await noted;
    await r.deliver();
    expect((await second).ok).toBe(true);
    expect(r.sent).toHaveLength(4);
    expect(r.sent[3]).toMatchObject({ prefilled: ["r2"] });
    await r.deliver();
    await again;
  });

  it("a first-token note the pool does not need at once makes no call: it rides with the next one", async () => {
    const r = rig(8);
    const first = r.channel.admit(req("r1"), 1);
    await r.deliver();
    expect((await first).ok).toBe(true);
    await r.channel.prefilled("r1", "with-next-call");
    expect(r.sent).toHaveLength(1);
    void r.channel.admit(req("r2"), 1);
    expect(r.sent[1]).toMatchObject({ admits: [{ id: "r2" }], prefilled: ["r1"] });
  });

  it("never holds an admit behind a release on its way", async () => {
    const r = rig(8);
    const first = r.channel.admit(req("r1"), 1);
    await r.deliver();
    await first;
    void r.channel.release("r1", okReport);
    await r.advance(RELEASE_RIDE_MS);
    expect(r.sent).toHaveLength(2); // the release, on its way
    void r.channel.admit(req("r2"), 1);
    expect(r.sent).toHaveLength(3); // the next request's admit did not wait for it
    expect(r.sent[2]!.admits.map((a) => a.id)).toEqual(["r2"]);
  });

  /** Admits each id in a call of its own, one after the other, and returns once all are granted. */
  async function admitted(r: ReturnType<typeof rig>, ...ids: string[]) {
    for (const id of ids) {
      const a = r.channel.admit(req(id), 1);
      await r.deliver();
      expect((await a).ok).toBe(true);
    }
  }

  it("while other requests of the isolate run, a release rides with the next request's admit: one call per request", async () => {
    const r = rig(8);
    await admitted(r, "r1", "r2");
    for (const [done, next] of [
      ["r1", "r3"],
      ["r2", "r4"],
    ] as const) {
      void r.channel.release(done, okReport);
      await r.advance(RELEASE_RIDE_MS - 1);
      await admitted(r, next);
    }
    expect(r.sent.map((e) => [e.admits.map((a) => a.id), e.releases.map((x) => x.id)])).toEqual([
      [["r1"], []],
      [["r2"], []],
      [["r3"], ["r1"]],
      [["r4"], ["r2"]],
    ]);
    // r3's release rides; r4's is the isolate's last, goes at once, and takes r3's with it.
    void r.channel.release("r3", okReport);
    await r.settle();
    expect(r.sent).toHaveLength(4);
    void r.channel.release("r4", okReport);
    expect(r.sent).toHaveLength(5);
    expect(r.sent[4]!.releases.map((x) => x.id)).toEqual(["r3", "r4"]);
    await r.deliver();
    expect(r.core.status(0).leases).toBe(0);
  });

  it("the release of the isolate's only running request goes at once: no call is coming to carry it", async () => {
    const r = rig(8);
    await admitted(r, "r1");
    void r.channel.release("r1", okReport);
    expect(r.sent).toHaveLength(2);
    expect(r.sent[1]).toMatchObject({ admits: [], releases: [{ id: "r1" }] });
  });

  it("a riding release nothing comes to carry goes alone after RELEASE_RIDE_MS, and settles once answered", async () => {
    const r = rig(8);
    await admitted(r, "r1", "r2");
    let settled = false;
    void r.channel.release("r1", okReport).then(() => {
      settled = true;
    });
    await r.advance(RELEASE_RIDE_MS - 1);
    expect(r.sent).toHaveLength(2);
    await r.advance(1);
    expect(r.sent).toHaveLength(3);
    expect(r.sent[2]).toMatchObject({ admits: [], releases: [{ id: "r1" }] });
    expect(settled).toBe(false);
    await r.deliver();
    expect(settled).toBe(true);
    expect(r.core.status(0).leases).toBe(1);
  });

  it("a release with a failed attempt goes at once: the breakers want it", async () => {
    const r = rig(8);
    await admitted(r, "r1", "r2");
    void r.channel.release("r1", {
      attempts: [{ endpoint: "e0", verdict: "fail", reason: "connect refused" }],
    });
    expect(r.sent).toHaveLength(3);
    expect(r.sent[2]).toMatchObject({ releases: [{ id: "r1" }] });
  });

  it("a riding release goes at once when an answer to another call says the pool is in a hurry", async () => {
    // Eight sequences, a ceiling of 1: from four leases on, the pool is at half of it.
    const r = rig(8);
    await admitted(r, "r1", "r2", "r3");
    const fourth = r.channel.admit(req("r4"), 1);
    void r.channel.release("r1", okReport); // r4's call left before it: it rides
    await r.settle();
    expect(r.sent).toHaveLength(4);
    await r.deliver(); // 4 of 8 sequences held: the answer says hurry
    expect((await fourth).ok).toBe(true);
    expect(r.sent).toHaveLength(5);
    expect(r.sent[4]).toMatchObject({ admits: [], releases: [{ id: "r1" }] });
  });

  it("after an answer that says the pool is in a hurry, releases and first-token notes go at once", async () => {
    const r = rig(8);
    await admitted(r, "r1", "r2", "r3", "r4"); // the last answer, at 4 of 8, says hurry
    // A calmer grant said the note may wait; the pool's last word is that it may not.
    void r.channel.prefilled("r1", "with-next-call");
    expect(r.sent).toHaveLength(5);
    expect(r.sent[4]).toMatchObject({ admits: [], prefilled: ["r1"] });
    await r.deliver(); // still 4 of 8
    void r.channel.release("r2", okReport);
    expect(r.sent).toHaveLength(6);
    expect(r.sent[5]).toMatchObject({ admits: [], releases: [{ id: "r2" }] });
  });

  it("learns a queued admit's decision through one poll, made while it waits", async () => {
    const r = rig(1);
    const a = r.channel.admit(req("r1"), 1);
    await r.deliver();
    await a;
    const b = r.channel.admit(req("r2"), 1);
    const c = r.channel.admit(req("r3"), 1);
    await r.deliver(); // r2 queues
    await r.deliver(); // r3 queues
    expect(r.sent.filter((e) => e.poll)).toHaveLength(1);
    await r.deliver(); // the poll, held: nothing decided yet
    void r.channel.release("r1", okReport);
    await r.settle();
    await r.deliver(); // the release: r2 goes, and the held poll answers
    const granted = await b;
    expect(granted.ok && granted.lease.id).toBe("r2");
    // r3 still waits, on a new poll that acknowledges r2's decision.
    const polls = r.sent.filter((e) => e.poll);
    expect(polls).toHaveLength(2);
    expect(polls[1]!.ack).toBe(1);
    void r.channel.release("r2", okReport);
    await r.settle();
    await r.deliver(); // the second poll, held
    await r.deliver(); // the release
    expect((await c).ok).toBe(true);
  });

  it("counts a call with no answer by its deadline as lost, and gives back at the pool what it may have granted", async () => {
    const r = rig(1);
    const lost = r.channel.admit(req("r1"), 1);
    const rejected = expect(lost).rejects.toBeInstanceOf(PoolCallLost);
    // The pool takes the call and grants, but the answer never arrives.
    const dropped = r.wire.shift()!;
    const desk = new PoolExchange(r.core);
    desk.exchange(dropped.ex, 0, () => {});
    expect(r.core.status(0).leases).toBe(1);
    await r.advance(2_000);
    await rejected;
    // The next call carries the abandon: the lease is free again.
    const next = r.channel.admit(req("r2"), 1);
    await r.settle();
    expect(r.sent.at(-1)!.abandons).toEqual(["r1"]);
    await r.deliver();
    expect((await next).ok).toBe(true);
    expect(r.core.status(0).endpoints[0]!.inflight).toBe(1);
  });

  it("drops an admit not yet sent when its client leaves, and abandons one already sent", async () => {
    const r = rig(1);
    const a = r.channel.admit(req("r1"), 1);
    const b = r.channel.admit(req("r2"), 1); // waits behind r1's call
    await r.channel.abandon("r2");
    expect(await b).toMatchObject({ ok: false, code: "abandoned" });
    await r.deliver();
    await a;
    expect(r.sent.flatMap((e) => e.admits.map((x) => x.id))).toEqual(["r1"]);
    const gone = r.channel.abandon("r1");
    await r.settle();
    await r.deliver();
    await gone;
    expect(r.sent.at(-1)!.abandons).toEqual(["r1"]);
    expect(r.core.status(0).leases).toBe(0);
  });

  it("survives a transport that throws: the admit is lost, the next one goes through", async () => {
    let fail = true;
    const core = new PoolCore("m", routerSchema.parse({}), mulberry32(1));
    core.setEndpoints(1, [plainEndpoint("e0")], 0);
    const desk = new PoolExchange(core);
    const channel = new PoolChannel({
      id: "iso",
      answerWithinMs: 2_000,
      pollHoldMs: 1_000,
      send: (ex) => {
        if (fail) throw new Error("no pool");
        return new Promise((resolve) => desk.exchange(ex, 0, resolve));
      },
    });
    await expect(channel.admit(req("r1"), 1)).rejects.toBeInstanceOf(PoolCallLost);
    fail = false;
    expect((await channel.admit(req("r2"), 1)).ok).toBe(true);
  });
});

describe("PoolChannel with grants", () => {
  const drain = async (r: ReturnType<typeof rig>) => {
    while (r.wire.length > 0) await r.deliver();
  };
  const asked = (r: ReturnType<typeof rig>, id: string) =>
    r.sent.some((e) => e.admits.some((a) => a.id === id));

  /** Admits through a call to the pool, every call on the wire delivered, and returns the lease. */
  async function viaPool(r: ReturnType<typeof rig>, request: AdmitRequest) {
    const a = r.channel.admit(request, 1);
    expect(asked(r, request.id)).toBe(true);
    await drain(r);
    const got = await a;
    if (!got.ok) throw new Error(`refused: ${got.message}`);
    expect(got.lease.granted).toBeUndefined();
    return got.lease;
  }

  /** Admits from a grant, no admit sent; then delivers what is on the wire (a use going at once). */
  async function fromGrant(r: ReturnType<typeof rig>, request: AdmitRequest) {
    const got = await r.channel.admit(request, 1);
    if (!got.ok) throw new Error(`refused: ${got.message}`);
    expect(got.lease.granted).toBe(true);
    expect(asked(r, request.id)).toBe(false);
    await drain(r);
    return got.lease;
  }

  it("one request after another: each is admitted from the last one's grant without a call, and its use rides with its own release", async () => {
    const r = rig(64, true);
    const first = await viaPool(r, req("r1"));
    void r.channel.release(first.id, okReport);
    await r.deliver();
    for (const id of ["r2", "r3", "r4"]) {
      const lease = await fromGrant(r, req(id));
      // The pool has not heard of it yet: its slot is one of the two set aside (GRANT_STOCK).
      expect(r.core.status(0).endpoints[0]).toMatchObject({ inflight: 0, reserved: 2 });
      const calls = r.sent.length;
      void r.channel.release(lease.id, okReport);
      expect(r.sent).toHaveLength(calls + 1);
      expect(r.sent.at(-1)).toMatchObject({ admits: [], used: [{ grant: lease.id, req: { id } }] });
      expect(r.sent.at(-1)!.releases.map((x) => x.id)).toEqual([lease.id]);
      await r.deliver(); // its answer sets the next slot aside
    }
    // Four requests, five calls: one admit and four releases, three carrying a use.
    expect(r.channel.calls).toBe(5);
    expect(r.core.status(0).grants).toMatchObject({ issued: 5, used: 3, outstanding: 2 });
    expect(r.core.status(0).bands.find((b) => b.name === "gold")?.admitted).toBe(4);
  });

  it("a request unlike the grant's own asks the pool: another prompt, another place, or a session's turn", async () => {
    const r = rig(64, true);
    await viaPool(r, req("r1"));
    // The pool holds the session's pin; and a session's turn is granted nothing.
    await viaPool(r, req("r2", "s1"));
    await viaPool(r, withPrefix(req("r3"), 7, 8));
    await fromGrant(r, withPrefix(req("r4"), 7, 8, 9));
    await fromGrant(r, req("r5"));
    // From another place: its site preference may differ.
    const eu = (id: string): AdmitRequest => ({ ...req(id), location: { continent: "EU", colo: "FRA" } });
    await viaPool(r, eu("r6"));
    await fromGrant(r, eu("r7"));
    await fromGrant(r, req("r8"));
    // The uses that rode (the stock was not low) reach the pool by GRANT_NOTE_MS.
    await r.advance(GRANT_NOTE_MS);
    await drain(r);
    expect(r.core.status(0).grants).toMatchObject({ used: 4 });
  });

  it("keeps the request that used a grant alive until its use was carried, not for the whole GRANT_NOTE_MS", async () => {
    const r = rig(64, true);
    const first = await viaPool(r, req("r1"));
    void r.channel.release(first.id, okReport);
    await r.deliver();
    let told = false;
    const got = await r.channel.admit(req("r2"), 1, (p) => void p.then(() => (told = true)));
    if (!got.ok) throw new Error("refused");
    void r.channel.release(got.lease.id, okReport);
    await r.deliver();
    expect(told).toBe(true);
  });

  it("the use by the isolate's only running request, no release carrying it, goes alone after GRANT_NOTE_MS", async () => {
    const r = rig(64, true);
    const first = await viaPool(r, req("r1"));
    void r.channel.release(first.id, okReport);
    await r.deliver();
    const lease = await fromGrant(r, req("r2"));
    await r.advance(GRANT_NOTE_MS - 1);
    expect(r.sent).toHaveLength(2);
    await r.advance(1);
    expect(r.sent).toHaveLength(3);
    expect(r.sent[2]).toMatchObject({ admits: [], releases: [], used: [{ grant: lease.id }] });
    await r.deliver();
    expect(r.core.status(0)).toMatchObject({ leases: 1, grants: { used: 1 } });
  });

  // A use lost with its call goes again with the next call; the pool counts its request once,
  // whether the lost call never reached it or reached it and only its answer was lost.
  it.each([
    ["failed at once: a use lost with it goes again, and its request is counted", (r: Rig) => r.fail()],
    [
      "was taken by the pool but its answer lost: the use sent again is not counted twice",
      async (r: Rig) => {
        const dropped = r.wire.shift()!;
        new PoolExchange(r.core).exchange(dropped.ex, 0, () => {});
        dropped.reject(new Error("the answer was lost"));
        await r.settle();
      },
    ],
  ])("a call that %s", async (_, lose) => {
    const r = rig(64, true);
    const first = await viaPool(r, req("r1"));
    void r.channel.release(first.id, okReport);
    await r.deliver();
    const lease = await fromGrant(r, req("r2"));
    await r.advance(GRANT_NOTE_MS);
    expect(r.sent.at(-1)).toMatchObject({ used: [{ grant: lease.id }] });
    await lose(r);
    const third = r.channel.admit(req("r3", "s3"), 1);
    await r.settle();
    expect(r.sent.at(-1)).toMatchObject({
      admits: [{ id: "r3" }],
      used: [{ grant: lease.id, resent: true }],
    });
    await r.deliver();
    expect((await third).ok).toBe(true);
    expect(r.core.status(0).endpoints[0]!.inflight).toBe(2);
    expect(r.core.status(0)).toMatchObject({ leases: 2, grants: { used: 1, late: 0 } });
  });

  it("beside other running requests, with the stock run low, a use goes with the next call or alone at once: its answer brings the next slot", async () => {
    const r = rig(64, true);
    await viaPool(r, req("r1"));
    const got = await r.channel.admit(req("r2"), 1);
    if (!got.ok) throw new Error("refused");
    expect(r.sent).toHaveLength(2);
    expect(r.sent[1]).toMatchObject({ admits: [], used: [{ grant: got.lease.id }] });
    await r.deliver();
    // Two slots were set aside with r1's lease; r2's use earned the one that tops the stock up again.
    expect(r.core.status(0).grants).toMatchObject({ issued: 3, used: 1, outstanding: 2 });
  });

  it("gives its grants back, and asks, once an answer says the pool is in a hurry", async () => {
    // Sixteen sequences, a ceiling of 1: slots while under 4 held, a hurry from 8 on.
    const r = rig(16, true);
    await viaPool(r, withPrefix(req("r1"), 1)); // and two slots for the next like it: 3 of 16
    for (let i = 2; i <= 6; i++) await viaPool(r, withPrefix(req(`r${i}`), i)); // 8 of 16: hurry
    const a = r.channel.admit(withPrefix(req("r7"), 1), 1);
    expect(r.sent).toHaveLength(7);
    expect(r.sent[6]!.returned).toHaveLength(2);
    await r.deliver();
    expect((await a).ok).toBe(true);
    expect(r.core.status(0).grants).toMatchObject({ issued: 2, returned: 2, used: 0 });
  });

  it("a grant not used within GRANT_USE_MS is given back with the next call, and that request asks", async () => {
    const r = rig(64, true);
    await viaPool(r, req("r1"));
    await r.advance(GRANT_USE_MS);
    await viaPool(r, req("r2"));
    expect(r.sent[1]!.returned).toHaveLength(2);
  });

  it("a failed attempt gives back the grants on its endpoint", async () => {
    const r = rig(64, true);
    const first = await viaPool(r, req("r1"));
    await viaPool(r, withPrefix(req("r2"), 5)); // another request running, so the release would ride
    void r.channel.release(first.id, { attempts: [{ endpoint: "e0", verdict: "fail", reason: "reset" }] });
    expect(r.sent.at(-1)!.returned).toHaveLength(3);
    await r.deliver();
    await viaPool(r, req("r3"));
  });
});
