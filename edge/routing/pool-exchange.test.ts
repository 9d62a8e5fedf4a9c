import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../common/rng.ts";
import { routerSchema } from "../config/router.ts";
import { plainEndpoint } from "./plain-endpoint.ts";
import { PoolCore } from "./pool-core.ts";
import { BUSY_CALLS_PER_S, POLL_HOLD_MS, PoolExchange } from "./pool-exchange.ts";
import type { AdmitRequest, Exchange, ExchangeAnswer } from "./pool-protocol.ts";

/** One endpoint of `seqs` sequences, admitting gold up to all of them. */
function desk(seqs = 2) {
  const core = new PoolCore(
    "m",
    routerSchema.parse({
      admission: { bands: [{ name: "gold", priority: 1, saturation_ceiling: 1 }], default_band: "gold" },
      scoring: { seq_ceiling: 1 },
    }),
    mulberry32(1),
  );
  core.setEndpoints(1, [plainEndpoint("e0", { capacity: { maxSeqs: seqs } })], 0);
  return { core, desk: new PoolExchange(core) };
}

const req = (id: string): AdmitRequest => ({ id, band: "gold", key: "k", policy: "chat", prefix: [] });

function ex(channel: string, extra: Partial<Exchange> = {}): Exchange {
  return {
    channel,
    endpointsVersion: 1,
    admits: [],
    releases: [],
    abandons: [],
    ack: 0,
    poll: false,
    failOpens: 0,
    ...extra,
  };
}

const ok = (id: string) => ({ id, report: { attempts: [{ endpoint: "e0", verdict: "ok" as const }] } });

/** Sends `e` and returns its answer box: empty while a poll is held. */
function call(d: PoolExchange, e: Exchange, now = 0) {
  const box: { answer: ExchangeAnswer | undefined } = { answer: undefined };
  d.exchange(e, now, (a) => {
    box.answer = a;
  });
  return box;
}

describe("PoolExchange", () => {
  it("says it is busy from BUSY_CALLS_PER_S calls in a second on, and not once they slow down", () => {
    const { desk: d } = desk(1);
    for (let i = 0; i < BUSY_CALLS_PER_S - 1; i++) expect(call(d, ex("a"), i).answer?.busy).toBe(false);
    expect(call(d, ex("a"), 600).answer?.busy).toBe(true);
    // Into the next second, the last one's calls weigh by how much of it is still inside.
    expect(call(d, ex("a"), 1_000).answer?.busy).toBe(true);
    expect(call(d, ex("a"), 1_900).answer?.busy).toBe(false);
    expect(call(d, ex("a"), 3_000).answer?.busy).toBe(false);
  });

  it("applies a call's releases before its admits, so the capacity they free serves the same call", () => {
    const { desk: d, core } = desk(1);
    expect(call(d, ex("a", { admits: [req("r1")] })).answer?.decided[0]?.admission.ok).toBe(true);
    const second = call(d, ex("a", { releases: [ok("r1")], admits: [req("r2")] })).answer!;
    expect(second.decided.map((x) => [x.id, x.admission.ok])).toEqual([["r2", true]]);
    expect(core.status(0).endpoints[0]!.inflight).toBe(1);
  });

  it("applies a call's first-token notes before its admits, so the queue they free serves the same call", () => {
    const { desk: d, core } = desk(256);
    const stream = (id: string): AdmitRequest => ({
      ...req(id),
      demand: { promptTokens: 1_024, outputTokens: 10, reportsFirstToken: true },
    });
    // target_prefilling 2: two streams waiting for their first token fill the endpoint.
    call(d, ex("a", { admits: [stream("r1"), stream("r2")] }));
    expect(call(d, ex("a", { admits: [stream("r3")] })).answer?.decided).toEqual([]);
    const next = call(d, ex("a", { prefilled: ["r1"], admits: [stream("r4")] })).answer!;
    // r3 waited longer: the freed place is its, and r4 queues behind it.
    expect(next.later.map((x) => [x.id, x.admission.ok])).toEqual([["r3", true]]);
    expect(core.status(0).endpoints[0]).toMatchObject({ inflight: 3, prefilling: 2 });
  });

  it("answers a queued admit through its channel's mailbox: to the held poll at once, and again until acknowledged", () => {
    const { desk: d } = desk(1);
    call(d, ex("a", { admits: [req("r1")] }));
    const queued = call(d, ex("b", { admits: [req("r2")] })).answer!;
    expect(queued.decided).toEqual([]);
    const poll = call(d, ex("b", { poll: true }), 10);
    expect(poll.answer).toBeUndefined();
    // Another isolate's release frees the slot: r2 goes, and b's poll hears of it.
    call(d, ex("a", { releases: [ok("r1")] }), 20);
    expect(poll.answer?.later.map((l) => [l.seq, l.id, l.admission.ok])).toEqual([[1, "r2", true]]);
    // Not acknowledged yet: the next answer carries it again; acknowledged, it is gone.
    expect(call(d, ex("b"), 30).answer?.later.map((l) => l.id)).toEqual(["r2"]);
    expect(call(d, ex("b", { ack: 1 }), 40).answer?.later).toEqual([]);
  });

  it("holds a poll with nothing to say for POLL_HOLD_MS, and a newer poll replaces an older one", () => {
    const { desk: d } = desk(1);
    const first = call(d, ex("a", { poll: true }), 0);
    const second = call(d, ex("a", { poll: true }), 100);
    expect(first.answer).toEqual({ decided: [], later: [], busy: false, hurry: false });
    expect(second.answer).toBeUndefined();
    expect(d.nextWakeAt()).toBe(100 + POLL_HOLD_MS);
    d.tick(100 + POLL_HOLD_MS);
    expect(second.answer).toEqual({ decided: [], later: [], busy: false, hurry: false });
  });

  it("gives back a lease granted to a channel that went quiet before it took it", () => {
    const { desk: d, core } = desk(1);
    call(d, ex("a", { admits: [req("r1")] }));
    call(d, ex("gone", { admits: [req("r2")] }));
    call(d, ex("a", { releases: [ok("r1")] }), 10);
    expect(core.status(10).leases).toBe(1); // r2's, undelivered
    call(d, ex("a"), 59_000); // a stays in touch; "gone" does not
    d.tick(d.nextWakeAt()!);
    d.tick(d.nextWakeAt()!);
    expect(core.status(200_000).leases).toBe(0);
  });

  it("counts the fail-opens a call reports, with or without admits", () => {
    const { desk: d, core } = desk(1);
    call(d, ex("a", { failOpens: 2 }));
    call(d, ex("a", { failOpens: 1, admits: [req("r1")] }));
    expect(core.status(0).failOpens).toBe(3);
    expect(d.counters).toEqual({ calls: 2, polls: 0, admits: 1, releases: 0 });
  });

  it("answers each admit it decided, and each grant's use, with a grant for the channel's next like request", () => {
    const { core, desk: d } = desk(64);
    const a = call(d, ex("iso", { admits: [req("r1"), req("r2")] })).answer!;
    expect(a.decided.map((x) => x.admission.ok)).toEqual([true, true]);
    expect(a.grants).toHaveLength(2);
    const g = a.grants![0]!;
    // A use and its request's release in one call: the use first.
    const b = call(
      d,
      ex("iso", { used: [{ grant: g.id, endpoint: "e0", req: req("r3") }], releases: [ok(g.id)] }),
    ).answer!;
    expect(b.grants).toHaveLength(1);
    expect(core.status(0)).toMatchObject({ leases: 2, grants: { issued: 3, used: 1, outstanding: 2 } });
    // A poll that reports a use is answered at once, with its grant, not held.
    const next = b.grants![0]!;
    const c = call(d, ex("iso", { poll: true, used: [{ grant: next.id, endpoint: "e0", req: req("r4") }] }));
    expect(c.answer?.grants).toHaveLength(1);
    // Given back, a slot is free at once.
    call(d, ex("iso", { returned: [c.answer!.grants![0]!.id, a.grants![1]!.id] }));
    expect(core.status(0)).toMatchObject({ leases: 3, grants: { returned: 2, outstanding: 0 } });
    expect(core.status(0).endpoints[0]).toMatchObject({ inflight: 3, reserved: 0 });
  });
});
