/**
 * An isolate's side of coalesced calls to one model's pool (docs/routing.md,
 * "Coalesced calls"). A request's admit goes out at once when no other
 * admit's call to the pool is on its way, and rides in the next call while
 * one is; releases, abandons and first-token notes ride with whatever goes next, or go alone
 * when nothing is on its way. A release the pool is in no hurry for (its
 * last answer said so, and no attempt failed) first waits a little for a
 * call to ride with while other requests of the isolate are running. A lone request waits for nothing;
 * under load, the calls an isolate makes stay near one per round trip to
 * the pool however many requests it serves, and the busier the pool, the
 * longer its round trip and the fuller each call.
 *
 * Every call is made by a request that waits on it — the admit's or the
 * release's own caller — never by a timer, so on Workers the call belongs
 * to a request that is still alive. A caller whose call never answers (its
 * request was cancelled, the pool is gone) is found out by the others at
 * the call's deadline, not waited on forever: its admits are refused as
 * lost (the Worker fails open), and abandoned at the pool in case it granted
 * them.
 *
 * An admit that queued at the pool is decided later. While any of its admits
 * wait, the channel keeps one poll open, made by one of the waiting
 * requests; the pool answers it when a decision lands in the channel's
 * mailbox (edge/routing/pool-exchange.ts).
 *
 * Far below every ceiling, an answer may carry grants (docs/routing.md,
 * "Grants"): slots the pool set aside for the isolate's next requests like
 * the ones the call admitted or reported. A request that fits one is
 * admitted here at once, without a call, and its use goes to the pool
 * afterwards, as a note. Grants go back to the pool with the next call
 * once they expire, an answer says the pool is in a hurry, an attempt on
 * their endpoint fails, or a newer endpoint set is seen.
 *
 * A pool far away (its quickest answer over PIPELINE_FAR_MS) changes one
 * thing: an admit does not wait a whole round trip for the call on its way
 * when that call left more than a quarter of a round trip ago. It goes in a
 * call of its own then, up to MAX_ADMIT_CALLS on their way, so a request
 * pays the distance about once instead of up to twice, and the isolate
 * still sends at most a few calls per round trip. Only while the pool says
 * it is not busy: a busy pool's answers are slow because it is busy, and
 * more calls would make it busier; there, folding admits into fewer calls
 * is what holds it at its capacity.
 *
 * On Workers a promise belongs to the request that created it, and one
 * request resolving another's after that one has ended is refused (workerd
 * warns, and cancels what followed). So a request waits only on promises of
 * its own: it hands the call it waits for a wake-up of its own and takes it
 * back when it stops waiting, and the request that makes a call keeps
 * itself alive until the call is answered (`keepAlive`), because a poll can
 * outlive the admit that opened it (its decision came with another call).
 */
import { MIN_PREFIX_SHARE } from "./picker.ts";
import {
  type Admission,
  type AdmitRequest,
  type Exchange,
  type ExchangeAnswer,
  GRANT_STOCK,
  type Grant,
  type GrantUse,
  type ReleaseReport,
} from "./pool-protocol.ts";
import type { Location } from "./types.ts";

export class PoolCallLost extends Error {}

/** Keeps the calling request alive until `answered` settles (the runtime's waitUntil). */
export type KeepAlive = (answered: Promise<unknown>) => void;

const POLL_RETRY_MS = 100;
/** A pool whose quickest answer takes longer than this is far: admits may pipeline. */
export const PIPELINE_FAR_MS = 5;
/** Admit calls on their way at once, at most, when pipelining. */
export const MAX_ADMIT_CALLS = 4;
/**
 * How long a release the pool is in no hurry for waits for a call to ride
 * with before it goes alone: the longest the pool counts a finished request
 * as in flight, at ten calls a second at most from an isolate whose
 * requests come further apart than this.
 */
export const RELEASE_RIDE_MS = 100;
/**
 * How long after its arrival a grant may be used: the pool holds its slot
 * for GRANT_HOLD_MS (pool-core.ts), which leaves room for this, the note's
 * ride and both calls' way.
 */
export const GRANT_USE_MS = 500;
/**
 * How long the use of a grant by the isolate's only running request waits
 * for a call to ride with (its own release, as a rule) before it goes
 * alone: the pool does not record the request's prompt until it hears of it.
 */
export const GRANT_NOTE_MS = 250;

export interface PoolChannelOptions {
  /** Names this channel at the pool: one per isolate and model. */
  id: string;
  send: (ex: Exchange) => Promise<ExchangeAnswer>;
  /** How long the pool has to answer a call before it counts as lost (a poll gets its hold on top). */
  answerWithinMs: number;
  /** The pool's hold of a poll with nothing to say. */
  pollHoldMs: number;
  /** The most admits and releases one call carries. */
  maxBatch?: number;
  now?: () => number;
  /** A timer the channel cancels once what it waited for came first. */
  timer?: (ms: number) => Timer;
}

export interface Timer {
  fired: Promise<void>;
  cancel(): void;
}

function setTimer(ms: number): Timer {
  let id: ReturnType<typeof setTimeout> | undefined;
  const fired = new Promise<void>((r) => {
    id = setTimeout(r, ms);
  });
  return {
    fired,
    cancel: () => {
      if (id !== undefined) clearTimeout(id);
    },
  };
}

interface Call {
  sentAt: number;
  poll: boolean;
  /** Wake-ups of the requests waiting on this call's answer. */
  waiters: Set<() => void>;
  done: boolean;
  /** Ended without an answer. */
  lost: boolean;
  deadline: number;
  admits: AdmitEntry[];
  notes: NoteEntry[];
  failOpens: number;
}

interface AdmitEntry {
  req: AdmitRequest;
  state: "unsent" | "sent" | "queued" | "done";
  /** The call that carried it, while its answer is awaited. */
  sentWith?: Call;
  admission: Admission | undefined;
  decided: () => void;
  decision: Promise<void>;
}

interface NoteEntry {
  kind: "release" | "abandon" | "prefilled" | "use" | "return";
  id: string;
  report?: ReleaseReport;
  use?: GrantUse;
  /** Wakes the request riding with this note once a call settled it (a grant's use only). */
  settled?: () => void;
  state: "unsent" | "sent" | "done" | "lost";
  sentWith?: Call;
}

const ABANDONED: Admission = {
  ok: false,
  status: 503,
  code: "abandoned",
  message: "The client left before the request was admitted.",
  retryAfterMs: 0,
};

export class PoolChannel {
  private unsentAdmits: AdmitEntry[] = [];
  private unsentNotes: NoteEntry[] = [];
  /** Admits sent and not yet decided, by id. */
  private readonly open = new Map<string, AdmitEntry>();
  /** The call on its way that carries admits, and one that carries only notes (releases, abandons, first tokens). */
  private admitLane: Call | undefined;
  private noteLane: Call | undefined;
  private poller: Call | undefined;
  private ack = 0;
  private failOpens = 0;
  private version = 0;
  /** Admit calls on their way (one, or up to MAX_ADMIT_CALLS when pipelining). */
  private readonly admitCalls = new Set<Call>();
  /** The quickest answer to a call that was not a poll: the distance to the pool, about. */
  private quickestMs = Number.POSITIVE_INFINITY;
  /** What the pool's last answer said of its own load. */
  private poolBusy = false;
  /** What the pool's last answer said of releases: wanted at once. */
  private poolHurry = false;
  /** Wake-ups of the releases waiting for a call to ride with, for when the pool is in a hurry. */
  private readonly riding = new Set<() => void>();
  /** Leases this channel was granted whose release has not come yet: the isolate's requests still running. */
  private running = 0;
  /** Slots the pool set aside for this isolate's next requests, and until when each may be used. */
  private grants: { grant: Grant; until: number }[] = [];
  private readonly maxBatch: number;
  private readonly now: () => number;
  private readonly timer: (ms: number) => Timer;
  /** Calls made, for the benchmark's count and the isolate's view of its own traffic. */
  calls = 0;

  constructor(private readonly opts: PoolChannelOptions) {
    this.maxBatch = opts.maxBatch ?? 256;
    this.now = opts.now ?? Date.now;
    this.timer = opts.timer ?? setTimer;
  }

  /**
   * Decides one request: granted, refused, or rejected with PoolCallLost if
   * the pool did not answer in time. `keepAlive` keeps the calling request
   * alive until a call it makes is answered (the runtime's waitUntil).
   */
  async admit(req: AdmitRequest, endpointsVersion: number, keepAlive?: KeepAlive): Promise<Admission> {
    return (
      this.admitFromGrant(req, endpointsVersion, keepAlive) ??
      this.admitByCall(req, endpointsVersion, keepAlive)
    );
  }

  /**
   * The request admitted at once from a grant that fits it, or undefined:
   * `admit`'s first step, on its own so a caller can skip what it sets up
   * only for a call (a timer, a listener for its client) when none is made.
   */
  admitFromGrant(req: AdmitRequest, endpointsVersion: number, keepAlive?: KeepAlive): Admission | undefined {
    this.version = Math.max(this.version, endpointsVersion);
    return this.fromGrant(req, keepAlive);
  }

  /** `admit`'s second step, the pool's answer to a call: for a caller that found no grant already. */
  async admitByCall(req: AdmitRequest, endpointsVersion: number, keepAlive?: KeepAlive): Promise<Admission> {
    this.version = Math.max(this.version, endpointsVersion);
    let decided!: () => void;
    const decision = new Promise<void>((r) => {
      decided = r;
    });
    const entry: AdmitEntry = { req, state: "unsent", admission: undefined, decided, decision };
    this.unsentAdmits.push(entry);
    while (entry.state !== "done") {
      const call =
        entry.state === "queued"
          ? this.polling(keepAlive)
          : entry.state === "unsent"
            ? this.sending(true, keepAlive)
            : entry.sentWith;
      if (!call) throw new Error(`admit ${req.id} is ${entry.state} with no call carrying it`);
      // Waiting for another admit's call: when pipelining, only until a call of its own may go.
      const goAt = entry.state === "unsent" ? this.pipelineAt(call) : undefined;
      if (goAt !== undefined && goAt < call.deadline) await this.within(goAt - this.now(), call, decision);
      else await this.until(call, decision);
      // A poll that failed at once must not become a busy loop against a pool that throws.
      if (call.lost && entry.state === "queued") await this.within(POLL_RETRY_MS, undefined, decision);
    }
    if (entry.admission === undefined) throw new PoolCallLost("the pool did not answer in time");
    return entry.admission;
  }

  /**
   * Frees a lease at the pool; resolves once a call carrying it was
   * answered. While other requests of this isolate run or wait, it first
   * waits up to RELEASE_RIDE_MS for one of their calls to ride with, so a
   * busy isolate makes about one call per request, not two. It goes at
   * once, like any note (with the call on its way, or alone), when the
   * pool's last answer said it is in a hurry, when an attempt failed (the
   * breakers want it), or when nothing else of this isolate is running:
   * then no call is coming soon, and one request at a time whose releases
   * rode with the next one's admit measured 0.2–0.3 ms slower to the first
   * token than with each release sent at once (bench:edge at concurrency 1,
   * docs/edge.md).
   */
  release(id: string, report: ReleaseReport): Promise<void> {
    this.running = Math.max(0, this.running - 1);
    const entry: NoteEntry = { kind: "release", id, report, state: "unsent" };
    const others = this.othersRunning();
    const failed = new Set(report.attempts.flatMap((a) => (a.verdict === "fail" ? [a.endpoint] : [])));
    if (failed.size > 0) this.giveBack((g) => failed.has(g.endpoint.id));
    if (!others || this.poolHurry || failed.size > 0) return this.note(entry);
    return this.ride(entry, RELEASE_RIDE_MS);
  }

  /**
   * A stream's first token came: the pool stops counting it as prefilling.
   * `now` sends it like a release, because near a ceiling it is what lets
   * the next request in, and so does a pool whose last answer said it is in
   * a hurry, whatever the lease said at its grant; otherwise it only rides
   * with the next call (the request's own release at the latest).
   */
  prefilled(id: string, when: "now" | "with-next-call" = "now"): Promise<void> {
    const entry: NoteEntry = { kind: "prefilled", id, state: "unsent" };
    if (when === "now" || this.poolHurry) return this.note(entry);
    this.unsentNotes.push(entry);
    return Promise.resolve();
  }

  /** The client left: an admit not yet sent is dropped here, one sent is abandoned at the pool. */
  abandon(id: string): Promise<void> {
    const unsent = this.unsentAdmits.findIndex((e) => e.req.id === id);
    if (unsent >= 0) {
      const [entry] = this.unsentAdmits.splice(unsent, 1);
      this.finish(entry!, ABANDONED);
      return Promise.resolve();
    }
    const open = this.open.get(id);
    if (open) this.finish(open, ABANDONED);
    return this.note({ kind: "abandon", id, state: "unsent" });
  }

  /**
   * Admits a request from a grant that fits it, at once and without a call,
   * and queues the use for the pool: like a release the pool is in a hurry
   * for while other requests of the isolate run and fewer than GRANT_STOCK
   * grants are left, since its answer brings the grant the next of them
   * will want; else riding up to GRANT_NOTE_MS with the isolate's next
   * call. Not while the pool's last answer said it is in a hurry: then
   * every request asks.
   */
  private fromGrant(req: AdmitRequest, keepAlive?: KeepAlive): Admission | undefined {
    if (this.grants.length === 0) return undefined;
    const now = this.now();
    this.giveBack((g, until) => until <= now || g.endpointsVersion < this.version);
    if (this.poolHurry) return undefined;
    const i = this.grants.findIndex((h) => fits(h.grant, req));
    if (i < 0) return undefined;
    const grant = this.grants.splice(i, 1)[0]!.grant;
    const others = this.othersRunning();
    const low = this.grants.length < GRANT_STOCK;
    this.running++;
    const entry: NoteEntry = {
      kind: "use",
      id: grant.id,
      use: { grant: grant.id, endpoint: grant.endpoint.id, req },
      state: "unsent",
    };
    // Beside others, with the stock run low, the use earns the slot the next request will want
    // soon: it goes with the next call, or alone if none is on its way. Alone, its own release is
    // the next call, as a rule.
    const told = (others && low ? this.note(entry) : this.ride(entry, GRANT_NOTE_MS)).catch(() => {});
    keepAlive?.(told);
    return {
      ok: true,
      lease: {
        id: grant.id,
        endpoint: grant.endpoint,
        alternates: grant.alternates,
        route: grant.route,
        band: req.band,
        queuedMs: 0,
        saturation: grant.saturation,
        ...(req.demand?.reportsFirstToken ? { firstTokenNote: "with-next-call" as const } : {}),
        granted: true,
      },
    };
  }

  /** Whether other requests of this isolate run or wait for the pool: a call of theirs is coming soon. */
  private othersRunning(): boolean {
    return this.running > 0 || this.open.size > 0 || this.unsentAdmits.length > 0;
  }

  /** Gives the grants `which` picks back to the pool, with the next call. */
  private giveBack(which: (g: Grant, until: number) => boolean): void {
    const kept: typeof this.grants = [];
    for (const h of this.grants) {
      if (which(h.grant, h.until)) this.unsentNotes.push({ kind: "return", id: h.grant.id, state: "unsent" });
      else kept.push(h);
    }
    this.grants = kept;
  }

  /** A request this isolate routed without the pool, for the pool's counter. */
  countFailOpen(): void {
    this.failOpens++;
  }

  private async note(entry: NoteEntry): Promise<void> {
    this.unsentNotes.push(entry);
    return this.follow(entry);
  }

  /**
   * A release is not woken when a call takes it: the request that made that
   * call keeps it alive until it is answered, and waking this one would put
   * a resumption of another request between that request's admit and its
   * upstream call. So the releasing request sleeps the whole wait (a timer
   * of its own) and then finds its release answered, as a rule. A grant's
   * use is woken once settled: the call that carries it is, as a rule, its
   * own request's release.
   */
  private async ride(entry: NoteEntry, ms: number): Promise<void> {
    this.unsentNotes.push(entry);
    let hurry!: () => void;
    const hurried = new Promise<void>((r) => {
      hurry = r;
    });
    if (entry.kind === "use") entry.settled = hurry;
    this.riding.add(hurry);
    try {
      await this.within(ms, undefined, hurried);
    } finally {
      this.riding.delete(hurry);
    }
    return this.follow(entry);
  }

  /** Waits until a call carrying the note was answered, making one if none takes it. */
  private async follow(entry: NoteEntry): Promise<void> {
    for (;;) {
      if (entry.state === "done") return;
      if (entry.state === "lost") throw new PoolCallLost(`the pool did not take the ${entry.kind} in time`);
      const call = entry.state === "unsent" ? this.sending(false) : entry.sentWith;
      if (!call) throw new Error(`${entry.kind} ${entry.id} is ${entry.state} with no call carrying it`);
      await this.until(call);
    }
  }

  /**
   * The call to wait on for unsent work, or a new one made now. An admit
   * waits only for another admit's call, never for a release on its way (a
   * request after a quiet spell would otherwise pay the previous one's
   * release before its own admit); a note (release, abandon, first token) waits for any
   * call, and rides in the next one.
   */
  private sending(admitting: boolean, keepAlive?: KeepAlive): Call | undefined {
    const busy = (c: Call | undefined): c is Call => c !== undefined && !c.done;
    if (busy(this.admitLane)) {
      const goAt = admitting ? this.pipelineAt(this.admitLane) : undefined;
      if (goAt === undefined || this.now() < goAt) return this.admitLane;
    }
    if (!admitting && busy(this.noteLane)) return this.noteLane;
    if (this.unsentAdmits.length === 0 && this.unsentNotes.length === 0) return undefined;
    const admits = this.unsentAdmits.splice(0, this.maxBatch);
    const notes = this.unsentNotes.splice(0, Math.max(0, this.maxBatch - admits.length));
    const call = this.call(admits, notes, false, keepAlive);
    if (admits.length > 0) this.admitLane = call;
    else this.noteLane = call;
    for (const a of admits) {
      a.state = "sent";
      a.sentWith = call;
      this.open.set(a.req.id, a);
    }
    return call;
  }

  /**
   * When an admit waiting for `lane` may go in a call of its own instead:
   * a quarter of the pool's distance after the lane left, if the pool is
   * far and not busy and fewer than MAX_ADMIT_CALLS are on their way.
   */
  private pipelineAt(lane: Call): number | undefined {
    if (this.poolBusy || !(this.quickestMs > PIPELINE_FAR_MS)) return undefined;
    if (this.admitCalls.size >= MAX_ADMIT_CALLS) return undefined;
    return lane.sentAt + this.quickestMs / MAX_ADMIT_CALLS;
  }

  /** The open poll, or a new one made now while admits wait in the pool's queue. */
  private polling(keepAlive?: KeepAlive): Call {
    if (this.poller && !this.poller.done) return this.poller;
    this.poller = this.call([], [], true, keepAlive);
    return this.poller;
  }

  private call(admits: AdmitEntry[], notes: NoteEntry[], poll: boolean, keepAlive?: KeepAlive): Call {
    const failOpens = this.failOpens;
    this.failOpens = 0;
    const hold = poll ? this.opts.pollHoldMs : 0;
    const call: Call = {
      sentAt: this.now(),
      poll,
      waiters: new Set(),
      done: false,
      lost: false,
      deadline: this.now() + hold + this.opts.answerWithinMs,
      admits,
      notes,
      failOpens,
    };
    for (const n of notes) {
      n.state = "sent";
      n.sentWith = call;
    }
    const used = notes.flatMap((n) => (n.kind === "use" ? [n.use!] : []));
    const returned = notes.flatMap((n) => (n.kind === "return" ? [n.id] : []));
    const ex: Exchange = {
      channel: this.opts.id,
      endpointsVersion: this.version,
      admits: admits.map((a) => a.req),
      releases: notes.flatMap((n) => (n.kind === "release" ? [{ id: n.id, report: n.report! }] : [])),
      abandons: notes.flatMap((n) => (n.kind === "abandon" ? [n.id] : [])),
      prefilled: notes.flatMap((n) => (n.kind === "prefilled" ? [n.id] : [])),
      ack: this.ack,
      poll,
      failOpens,
    };
    if (used.length > 0) ex.used = used;
    if (returned.length > 0) ex.returned = returned;
    this.calls++;
    if (admits.length > 0) this.admitCalls.add(call);
    let sent: Promise<ExchangeAnswer>;
    try {
      sent = this.opts.send(ex);
    } catch (err) {
      sent = Promise.reject(err);
    }
    const settled = sent.then(
      (answer) => this.answered(call, answer),
      () => this.lost(call),
    );
    keepAlive?.(settled);
    return call;
  }

  private answered(call: Call, answer: ExchangeAnswer): void {
    if (call.done) return;
    call.done = true;
    this.admitCalls.delete(call);
    this.poolBusy = answer.busy;
    this.poolHurry = answer.hurry;
    if (answer.hurry) {
      for (const hurry of this.riding) hurry();
      this.giveBack(() => true);
    }
    const until = this.now() + GRANT_USE_MS;
    for (const grant of answer.grants ?? []) this.grants.push({ grant, until });
    if (!call.poll) this.quickestMs = Math.min(this.quickestMs, this.now() - call.sentAt);
    for (const d of answer.decided) {
      const e = this.open.get(d.id);
      if (e) this.finish(e, d.admission);
    }
    for (const l of answer.later) {
      // Every answer carries the whole unacknowledged mailbox: what is at or below the ack was taken from an earlier one.
      if (l.seq <= this.ack) continue;
      this.ack = l.seq;
      // One not open stopped waiting, and its abandon is on its way.
      const e = this.open.get(l.id);
      if (e) this.finish(e, l.admission);
    }
    for (const a of call.admits) if (a.state === "sent") a.state = "queued";
    for (const n of call.notes) {
      n.state = "done";
      n.settled?.();
    }
    this.wake(call);
  }

  /** Waits for the call's answer, or `also`, and past its deadline counts the call lost. */
  private async until(call: Call, also?: Promise<void>): Promise<void> {
    await this.within(call.deadline - this.now(), call, also);
    // Whatever it carried is lost.
    if (!call.done && this.now() >= call.deadline) this.lost(call);
  }

  /** Waits `ms`, or for `call`'s answer, or for `also` (the waiter's own promise). */
  private async within(ms: number, call: Call | undefined, also?: Promise<void>): Promise<void> {
    const t = this.timer(Math.max(0, ms));
    let wake!: () => void;
    const woken = new Promise<void>((r) => {
      wake = r;
    });
    if (call?.done) wake();
    else call?.waiters.add(wake);
    try {
      await Promise.race([t.fired, woken, ...(also ? [also] : [])]);
    } finally {
      t.cancel();
      call?.waiters.delete(wake);
    }
  }

  private wake(call: Call): void {
    for (const w of call.waiters) w();
    call.waiters.clear();
  }

  private lost(call: Call): void {
    if (call.done) return;
    call.done = true;
    call.lost = true;
    this.admitCalls.delete(call);
    this.failOpens += call.failOpens;
    for (const a of call.admits) {
      if (a.state !== "sent") continue;
      this.finish(a, undefined);
      // The pool may have granted it before the answer was lost.
      this.unsentNotes.push({ kind: "abandon", id: a.req.id, state: "unsent" });
    }
    for (const n of call.notes) {
      n.state = "lost";
      n.settled?.();
      // A release lost is made good by its lease's grace; a use lost would leave its request
      // running uncounted once the slot expired, so it goes again with the next call.
      if (n.kind === "use")
        this.unsentNotes.push({ kind: "use", id: n.id, use: { ...n.use!, resent: true }, state: "unsent" });
    }
    this.wake(call);
  }

  private finish(e: AdmitEntry, admission: Admission | undefined): void {
    if (e.state === "done") return;
    e.state = "done";
    e.admission = admission;
    if (admission?.ok) this.running++;
    this.open.delete(e.req.id);
    e.decided();
  }
}

/**
 * Whether a request is like the one a grant was made for, so the pool would
 * most likely send it to the same endpoint: no session (a session's turn
 * asks the pool, which holds its pin), and a prompt that starts with enough
 * of the grant's blocks for the prefix tier to decide (picker.ts), or no
 * blocks on either side; from the same place, since that orders the sites.
 */
export function fits(g: Grant, req: AdmitRequest): boolean {
  if (req.policy !== "chat" || req.session !== undefined || !samePlace(g.location, req.location))
    return false;
  if (req.prefix.length === 0) return g.prefix.length === 0;
  const need = Math.ceil(req.prefix.length * MIN_PREFIX_SHARE);
  if (g.prefix.length < need) return false;
  for (let i = 0; i < need; i++) if (g.prefix[i] !== req.prefix[i]) return false;
  return true;
}

function samePlace(a: Location | undefined, b: Location | undefined): boolean {
  return a?.continent === b?.continent && a?.country === b?.country && a?.colo === b?.colo;
}
