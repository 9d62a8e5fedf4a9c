/**
 * The pool's side of coalesced calls (docs/routing.md, "Coalesced calls"):
 * applies an isolate's Exchange to the model's PoolCore — releases first, so
 * the capacity they free serves the queue and then this call's admits in
 * the same turn — and answers with what was decided at once, and with
 * grants for the isolate's next requests like the ones this call admitted
 * or reports admitted from grants, while the pool is far below every
 * ceiling (PoolCore.offerGrant; docs/routing.md, "Grants").
 *
 * An admit that queues is answered later, through its channel's mailbox:
 * the decision waits there, numbered, until the channel acknowledges it.
 * It goes out with the channel's next call, or at once to a poll the
 * channel holds open while it has queued admits. Acknowledged by number, not
 * delivered once, because a call can be lost with its isolate's request and
 * the next poll must still find the decision. A channel that goes quiet
 * (its isolate gone) has its undelivered leases abandoned, so the capacity
 * they hold is not kept until the leases expire.
 *
 * Pure and clock-free like PoolCore: every entry point takes `now`.
 */
import type { PoolCore } from "./pool-core.ts";
import {
  type Admission,
  type BreakerOpened,
  type Exchange,
  type ExchangeAnswer,
  GRANT_STOCK,
  type Grant,
} from "./pool-protocol.ts";

/** How long a poll with nothing to say is held: short enough that a lost poller is replaced soon. */
export const POLL_HOLD_MS = 1_000;
/**
 * Calls a second at which the pool tells its channels it is busy: half of
 * the ~1,000 one Durable Object takes, so channels stop pipelining well
 * before the pool is full (pool-channel.ts).
 */
export const BUSY_CALLS_PER_S = 500;
/** A channel silent this long belongs to an isolate that is gone. */
const CHANNEL_IDLE_MS = 60_000;

interface Channel {
  mailbox: { seq: number; id: string; admission: Admission }[];
  nextSeq: number;
  poll: { respond: (a: ExchangeAnswer) => void; until: number } | undefined;
  lastSeen: number;
}

export interface ExchangeCounters {
  /** Calls taken (polls included). */
  calls: number;
  polls: number;
  admits: number;
  releases: number;
}

export class PoolExchange {
  private readonly channels = new Map<string, Channel>();
  /** Channels holding a poll: few (those with admits queued), so the next wake is cheap to find. */
  private readonly polling = new Set<Channel>();
  private clock = 0;
  /** Calls in the current and the previous whole second, for `busy`. */
  private rate = { second: 0, now: 0, before: 0 };
  private sweepAt = Number.POSITIVE_INFINITY;
  readonly counters: ExchangeCounters = { calls: 0, polls: 0, admits: 0, releases: 0 };

  constructor(private readonly core: PoolCore) {}

  /** Applies the call; `respond` runs now, or later for a held poll. Returns the breakers its releases opened. */
  exchange(ex: Exchange, now: number, respond: (a: ExchangeAnswer) => void): BreakerOpened[] {
    this.clock = now;
    const ch = this.channel(ex.channel, now);
    ch.mailbox = ch.mailbox.filter((m) => m.seq > ex.ack);
    this.count(ex, now);
    this.core.countFailOpens(ex.failOpens);
    // Before the releases: a request admitted from a grant may have ended by this call.
    for (const u of ex.used ?? []) this.core.useGrant(u, now);
    for (const id of ex.returned ?? []) this.core.returnGrant(id, now);
    const opened: BreakerOpened[] = [];
    for (const r of ex.releases) opened.push(...this.core.release(r.id, r.report, now));
    for (const id of ex.abandons) this.core.abandon(id, now);
    for (const id of ex.prefilled ?? []) this.core.prefilled(id, now);
    const decided: ExchangeAnswer["decided"] = [];
    let answering = true;
    for (const req of ex.admits) {
      this.core.admit(req, now, (admission) => {
        if (answering) decided.push({ id: req.id, admission });
        else this.deliver(ex.channel, req.id, admission);
      });
    }
    answering = false;
    const grants = this.grants(ex, decided, now);
    const held =
      ex.poll && decided.length === 0 && ch.mailbox.length === 0 && ex.admits.length === 0 && !grants;
    if (held) {
      // A newer poll replaces the old: its caller may be gone.
      ch.poll?.respond(this.answer(now));
      ch.poll = { respond, until: now + POLL_HOLD_MS };
      this.polling.add(ch);
    } else respond(this.answer(now, decided, [...ch.mailbox], grants));
    return opened;
  }

  /**
   * A grant for each request the call admitted or reports admitted from a
   * grant, for the isolate's next request like it, as far as the pool stays
   * in no hurry (PoolCore.offerGrant): a chain, so one request after another
   * keeps finding its slot set aside.
   */
  private grants(ex: Exchange, decided: ExchangeAnswer["decided"], now: number): Grant[] | undefined {
    const out: Grant[] = [];
    const admitted = new Set(decided.flatMap((d) => (d.admission.ok ? [d.id] : [])));
    const bases = [...(ex.used ?? []).map((u) => u.req), ...ex.admits.filter((r) => admitted.has(r.id))];
    for (const basis of bases) {
      const g = this.core.offerGrant(ex.channel, basis, now);
      if (!g) break;
      out.push(g);
    }
    const last = bases.at(-1);
    while (last && out.length > 0 && this.core.grantsHeldBy(ex.channel) < GRANT_STOCK) {
      const g = this.core.offerGrant(ex.channel, last, now);
      if (!g) break;
      out.push(g);
    }
    return out.length > 0 ? out : undefined;
  }

  /** Answers polls held long enough, and forgets channels whose isolate is gone. */
  tick(now: number): void {
    this.clock = now;
    for (const ch of this.polling) {
      if (ch.poll && ch.poll.until > now) continue;
      ch.poll?.respond(this.answer(now));
      ch.poll = undefined;
      this.polling.delete(ch);
    }
    if (now < this.sweepAt) return;
    for (const [name, ch] of this.channels) {
      if (ch.poll || now - ch.lastSeen < CHANNEL_IDLE_MS) continue;
      this.channels.delete(name);
      // Granted to a caller that never came back for it.
      for (const m of ch.mailbox) if (m.admission.ok) this.core.abandon(m.id, now);
    }
    this.sweepAt = this.channels.size > 0 ? now + CHANNEL_IDLE_MS : Number.POSITIVE_INFINITY;
  }

  nextWakeAt(): number | undefined {
    let at = this.sweepAt;
    for (const ch of this.polling) if (ch.poll) at = Math.min(at, ch.poll.until);
    return Number.isFinite(at) ? at : undefined;
  }

  private deliver(channel: string, id: string, admission: Admission): void {
    const ch = this.channels.get(channel);
    if (!ch) {
      // The channel was forgotten while its admit queued: nobody will take the lease.
      if (admission.ok) this.core.abandon(id, this.clock);
      return;
    }
    ch.mailbox.push({ seq: ch.nextSeq++, id, admission });
    if (ch.poll) {
      ch.poll.respond(this.answer(this.clock, [], [...ch.mailbox]));
      ch.poll = undefined;
      this.polling.delete(ch);
    }
  }

  private channel(name: string, now: number): Channel {
    let ch = this.channels.get(name);
    if (!ch) {
      ch = { mailbox: [], nextSeq: 1, poll: undefined, lastSeen: now };
      this.channels.set(name, ch);
      if (!Number.isFinite(this.sweepAt)) this.sweepAt = now + CHANNEL_IDLE_MS;
    }
    ch.lastSeen = now;
    return ch;
  }

  private answer(
    now: number,
    decided: ExchangeAnswer["decided"] = [],
    later: ExchangeAnswer["later"] = [],
    grants?: Grant[],
  ): ExchangeAnswer {
    const a: ExchangeAnswer = { decided, later, busy: this.busy(now), hurry: this.core.notesWantedNow(now) };
    if (grants) a.grants = grants;
    return a;
  }

  /** Calls over the last second, the previous whole second weighed by how much of it is still inside. */
  private busy(now: number): boolean {
    this.roll(now);
    const into = (now % 1_000) / 1_000;
    return this.rate.before * (1 - into) + this.rate.now >= BUSY_CALLS_PER_S;
  }

  private roll(now: number): void {
    const second = Math.floor(now / 1_000);
    if (second === this.rate.second) return;
    this.rate = { second, now: 0, before: second === this.rate.second + 1 ? this.rate.now : 0 };
  }

  private count(ex: Exchange, now: number): void {
    this.roll(now);
    this.rate.now++;
    this.counters.calls++;
    if (ex.poll && ex.admits.length === 0 && ex.releases.length === 0) this.counters.polls++;
    this.counters.admits += ex.admits.length;
    this.counters.releases += ex.releases.length;
  }
}
