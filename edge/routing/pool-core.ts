/**
 * One model's pool: its endpoint set, live load, in-flight counts,
 * breakers, session pins, prefix index and band queues, and the two
 * messages a request sends it (docs/routing.md):
 *
 * - `admit` waits in the band's queue until the pool may dispatch, then
 *   picks an endpoint and grants a lease: the endpoint, ranked alternates
 *   for retries, and which tier decided. In-flight is counted, the session
 *   pinned and the prompt's blocks recorded at that moment, so the next
 *   decision already sees this one.
 * - `release` comes once when the request ends, with every attempt's verdict: it frees
 *   the in-flight slot and feeds the breakers. A lease never released (its isolate died)
 *   expires after the longest a request may run.
 * - far below every ceiling, `offerGrant` sets a slot aside, counted in
 *   flight, for an isolate's next request like one it just saw, and
 *   `useGrant` turns it into that request's lease once the isolate says it
 *   admitted one from it (docs/routing.md, "Grants").
 *
 * Pure and clock-free: every entry point takes `now`, and answers through a
 * callback, synchronously or when a later call (a release, a tick, a load
 * update) lets a queued request go. The Durable Object wraps it in promises
 * and a timer; the discrete-event benchmark drives it on a virtual clock.
 */
import type { RouterConfig } from "../config/router.ts";
import { Breakers } from "./breaker.ts";
import { CHARS_PER_TOKEN } from "./demand.ts";
import { FlowController, type Waiter } from "./flow-control.ts";
import { type Candidate, describeUnroutable, isRoutable, type Pick, pick } from "./picker.ts";
import type {
  Admission,
  AdmitRequest,
  BandCounters,
  BreakerOpened,
  Grant,
  GrantCounters,
  GrantUse,
  LoadUpdate,
  PoolStatus,
  RefusalCode,
  ReleaseReport,
} from "./pool-protocol.ts";
import { BLOCK_CHARS } from "./prefix-hash.ts";
import { PrefixIndex } from "./prefix-index.ts";
import { RecentCounts } from "./recent-counts.ts";
import { engineSaturation, feedIsLive, poolSaturation, saturationOf, signals } from "./saturation.ts";
import { SessionTable } from "./session-table.ts";
import { preferredSites, siteOf } from "./site-preference.ts";
import { SiteWarmup, siteHealth } from "./site-warmup.ts";
import type { EndpointSpec, LoadSample, Rejection, RouteTier } from "./types.ts";

export type * from "./pool-protocol.ts";

interface EndpointState {
  spec: EndpointSpec;
  /** Requests in flight here, and the grants' slots set aside (`reserved` of them). */
  inflight: number;
  /**
   * Slots set aside for grants not yet used, counted as requests in flight
   * here in every decision: for saturation, so no ceiling is passed when
   * they are used; in picking too, since a slot is used, as a rule, before
   * the pool hears of it.
   */
  reserved: number;
  /** Predicted tokens of the requests in flight here: what admits charged and releases have not freed. */
  tokens: number;
  /** Streams admitted here whose first token has not come yet. */
  prefilling: number;
  /** Their weight as a queue of prompts (PoolCore.prefillWeight): what saturation counts. */
  prefillLoad: number;
  load: LoadSample | undefined;
  /** Decision number of the last request sent here. */
  lastPick: number;
}

interface Held {
  endpoint: string;
  band: string;
  /** The tokens charged to the endpoint at admit, freed at release. */
  tokens: number;
  /** A stream counted as prefilling until its first token (or the release). */
  prefilling: boolean;
  /** Its weight in the endpoint's queue of prompts, counted while it is prefilling. */
  prefillWeight: number;
  expiresAt: number;
}

type Pending = { req: AdmitRequest; respond: (a: Admission) => void };

/** A grant not yet used: a request's slot with no request in it yet. */
interface Reserved {
  endpoint: string;
  route: RouteTier;
  channel: string;
  tokens: number;
  expiresAt: number;
}

/**
 * An endpoint as a decision sees it: picking compares the engine's own
 * state (`saturation`), admission also its queue of prompts still to
 * prefill (`admission`). Kept apart because a session's engine with two
 * prompts prefilling is no reason to send the session's next turn where
 * its cache is not; it is a reason to hold bronze at the gateway.
 */
type Scored = Candidate & {
  admission: number;
  /** Its scraped sample is past `stale_after` while other endpoints' are fresh: it counts in no mean. */
  stale: boolean;
};

const TICK_WHILE_QUEUED_MS = 1_000;
/**
 * How long the pool keeps a grant's slot for its isolate: the isolate uses
 * a grant only within GRANT_USE_MS of receiving it and tells the pool within
 * GRANT_NOTE_MS after (pool-channel.ts); the rest is for the calls' way.
 */
export const GRANT_HOLD_MS = 2_000;
/**
 * The share of the lowest ceiling under which, slot counted, the pool sets
 * slots aside: half of where notes start to hurry (noteUrgency), so the
 * slots never make the pool hurry by themselves. At the hurry line itself,
 * 16 streams on one engine with their releases riding crossed it back and
 * forth, and each crossing sent every note and release at once (bench:edge,
 * docs/edge.md).
 */
export const GRANT_BELOW = 0.25;
/** Grants one isolate's channel holds at once, at most: about the requests it runs at once. */
export const GRANTS_PER_CHANNEL = 16;
const LEASE_GRACE_MS = 60_000;
const TOMBSTONE_MS = 60_000;
/** A prefix block's tokens, at the rate the Worker's prompt estimate assumes. */
const TOKENS_PER_BLOCK = BLOCK_CHARS / CHARS_PER_TOKEN;
/** Prompt tokens (uncached) at which a stream counts as one whole prompt in its engine's queue. */
const WHOLE_PROMPT_TOKENS = 1_024;

/**
 * A stream's weight in its engine's queue of prompts still to prefill: one
 * for a prompt of WHOLE_PROMPT_TOKENS or more, a fraction for a shorter one.
 * A crowd of short prompts goes through the engine in one step and is no
 * queue; a long prompt is one however long, since the fleet must not be
 * held back for one conversation's long history (in the shared-prefix
 * simulation, counting its tokens cost a tenth of the throughput at the
 * knee: docs/routing.md).
 */
export function prefillWeightOf(promptTokens: number): number {
  return Math.min(1, promptTokens / WHOLE_PROMPT_TOKENS);
}

export class PoolCore {
  private readonly endpoints = new Map<string, EndpointState>();
  private endpointsVersion = -1;
  private readonly held = new Map<string, Held>();
  /** Grants not yet used, in the order granted (all held for the same span). */
  private readonly reserved = new Map<string, Reserved>();
  private readonly grantsByChannel = new Map<string, number>();
  private grantSeq = 0;
  /** Tells this pool's grants from an earlier instance's, whose ids an isolate may still hold. */
  private readonly grantPrefix: string;
  private readonly grantCounters: GrantCounters = { issued: 0, used: 0, late: 0, returned: 0, expired: 0 };
  private readonly tombstones = new Map<string, number>();
  private readonly sessions = new SessionTable();
  private readonly prefix: PrefixIndex;
  private readonly breakers: Breakers;
  private readonly flow: FlowController<Pending>;
  private readonly warmup = new SiteWarmup();
  private settings: RouterConfig;
  private clock = 0;
  private turn = 0;
  private failOpens = 0;
  private readonly estimated = { requests: 0, tokens: 0 };
  private lastRejections: Rejection[] = [];
  private readonly counters = new Map<string, BandCounters>();
  /** Requests admitted to each site's endpoints: the sites' shares of traffic (docs/sites.md). */
  private readonly routedBySite = new Map<string, number>();
  /** The same over the last minute: the shares as they are now, not since the pool started. */
  private readonly routedRecently = new RecentCounts();
  private readonly routes: Record<RouteTier, number> = {
    session: 0,
    prefix: 0,
    load: 0,
    "round-robin": 0,
    "least-load": 0,
    random: 0,
  };

  constructor(
    readonly model: string,
    settings: RouterConfig,
    private readonly random: () => number = Math.random,
  ) {
    this.settings = settings;
    this.prefix = new PrefixIndex(settings.scoring.prefix_cache_blocks);
    this.breakers = new Breakers(settings.failure_threshold, settings.cooldown, () => this.clock);
    this.flow = new FlowController(bandSpecs(settings), flowOptions(settings));
    this.grantPrefix = `g${Math.floor(random() * 2 ** 32).toString(36)}.`;
  }

  configure(settings: RouterConfig, now: number): void {
    this.clock = now;
    this.settings = settings;
    this.prefix.setCapacity(settings.scoring.prefix_cache_blocks);
    this.breakers.configure(settings.failure_threshold, settings.cooldown);
    for (const w of this.flow.configure(bandSpecs(settings), flowOptions(settings))) {
      w.item.respond(refusal(503, "no_capacity", `The band ${w.band} no longer exists.`, 1_000));
    }
    this.drain();
  }

  /** A newer endpoint set for this model; state of endpoints that stay is kept. */
  setEndpoints(version: number, specs: readonly EndpointSpec[], now: number): boolean {
    if (version < this.endpointsVersion) return false;
    this.clock = now;
    this.endpointsVersion = version;
    const next = new Set(specs.map((s) => s.id));
    for (const id of this.endpoints.keys()) {
      if (next.has(id)) continue;
      this.endpoints.delete(id);
      this.prefix.forget(id);
      this.sessions.forget(id);
      this.breakers.forget(id);
    }
    for (const spec of specs) {
      const e = this.endpoints.get(spec.id);
      if (e) e.spec = spec;
      else
        this.endpoints.set(spec.id, {
          spec,
          inflight: 0,
          reserved: 0,
          tokens: 0,
          prefilling: 0,
          prefillLoad: 0,
          load: undefined,
          lastPick: 0,
        });
    }
    this.drain();
    return true;
  }

  get version(): number {
    return this.endpointsVersion;
  }

  updateLoad(updates: readonly LoadUpdate[], now: number): void {
    this.clock = now;
    // Seen before the update lands: a site silent until now is known lost, so its return ramps.
    this.candidates();
    for (const u of updates) {
      const e = this.endpoints.get(u.endpoint);
      if (!e) continue;
      // A scrape stamped ahead of this clock (skew) counts as taken now.
      const sample = { ...u.sample, at: Math.min(u.sample.at, now) };
      if (!e.load || sample.at >= e.load.at) e.load = sample;
    }
    this.drain();
  }

  /** Usage the caller estimated since its last admit, which rides with the next one however it is admitted. */
  private countEstimated(req: AdmitRequest): void {
    if (req.estimated) for (const k of ["requests", "tokens"] as const) this.estimated[k] += req.estimated[k];
  }

  /** Fail-open decisions an isolate made while it could not reach the pool, for the counter. */
  countFailOpens(n: number): void {
    this.failOpens += n;
  }

  admit(req: AdmitRequest, now: number, respond: (a: Admission) => void): void {
    this.clock = now;
    this.countEstimated(req);
    if (this.tombstones.delete(req.id)) {
      respond(refusal(503, "abandoned", "The client left before the request was admitted.", 0));
      return;
    }
    if (this.endpoints.size === 0) {
      this.count(this.bandOf(req.band)).noEndpoints++;
      respond(refusal(503, "no_endpoints", `No endpoint serves model ${this.model} right now.`, 1_000));
      return;
    }
    const cands = this.candidates();
    if (!cands.some(isRoutable)) {
      this.count(this.bandOf(req.band)).noCapacity++;
      respond(
        refusal(
          503,
          "no_capacity",
          `No endpoint for model ${this.model} can take requests now (${cands.length} known: ${describeUnroutable(cands)}).`,
          1_000,
        ),
      );
      return;
    }
    const band = this.bandOf(req.band);
    const waiter: Waiter<Pending> = {
      id: req.id,
      band,
      key: req.key,
      enqueuedAt: now,
      deadline: now + this.flow.ttlMs,
      item: { req: { ...req, band }, respond },
    };
    const offer = this.flow.offer(waiter, this.saturationOf(cands));
    if (offer === "dispatch") this.dispatch(waiter, cands);
    else if (offer === "full") {
      this.count(band).full++;
      respond(
        refusal(
          429,
          "queue_full",
          `Too many requests are waiting for model ${this.model} in band ${band}; try again shortly.`,
          1_000,
        ),
      );
    } else this.count(band).queued++;
  }

  /** The client left: a queued request is dropped without dispatch; a granted lease is released as abandoned. */
  abandon(id: string, now: number): void {
    this.clock = now;
    const w = this.flow.remove(id);
    if (w) {
      this.count(w.band).abandoned++;
      w.item.respond(refusal(503, "abandoned", "The client left while the request was queued.", 0));
      return;
    }
    const lease = this.held.get(id);
    if (lease) {
      this.release(id, { attempts: [{ endpoint: lease.endpoint, verdict: "abandon" }] }, now);
      return;
    }
    this.tombstones.set(id, now + TOMBSTONE_MS);
  }

  /** Frees a lease and feeds the breakers; returns the breakers this opened. */
  release(id: string, report: ReleaseReport, now: number): BreakerOpened[] {
    this.clock = now;
    const opened: BreakerOpened[] = [];
    for (const a of report.attempts) {
      if (!this.endpoints.has(a.endpoint)) continue;
      if (a.verdict === "ok") this.breakers.onSuccess(a.endpoint);
      else if (a.verdict === "abandon") this.breakers.onAbandon(a.endpoint);
      else if (this.breakers.onFailure(a.endpoint, a.reason)) {
        const reason = this.breakers.reason(a.endpoint) ?? "failed";
        opened.push({ endpoint: a.endpoint, failures: this.breakers.failures(a.endpoint), reason });
      }
    }
    const lease = this.held.get(id);
    if (lease) {
      this.held.delete(id);
      this.free(lease);
    }
    this.drain();
    return opened;
  }

  /**
   * A stream's first token came: it no longer waits for its prefill, while
   * its sequence and tokens stay charged until the release.
   */
  prefilled(id: string, now: number): void {
    this.clock = now;
    const lease = this.held.get(id);
    if (!lease?.prefilling) return;
    lease.prefilling = false;
    const e = this.endpoints.get(lease.endpoint);
    if (e) {
      e.prefilling = Math.max(0, e.prefilling - 1);
      e.prefillLoad = Math.max(0, e.prefillLoad - lease.prefillWeight);
    }
    this.drain();
  }

  /**
   * Sets a slot aside for the channel's next request like `basis`, on the
   * endpoint the pool would pick for it now, if no band waits and, with the
   * slot counted, saturation stays under GRANT_BELOW of the lowest ceiling. The slot counts as a request in flight until it is used,
   * given back or expired, so no band's ceiling is passed by a grant's use.
   */
  offerGrant(channel: string, basis: AdmitRequest, now: number): Grant | undefined {
    this.clock = now;
    // A session's next turn comes when its user has read the answer, long after a grant's use window.
    if (!this.settings.admission.grants || basis.policy !== "chat" || basis.session) return undefined;
    if (this.flow.size > 0) return undefined;
    if ((this.grantsByChannel.get(channel) ?? 0) >= GRANTS_PER_CHANNEL) return undefined;
    const cands = this.candidates();
    const limit = this.lowestCeiling() * GRANT_BELOW;
    // Checked before the pick: a loaded pool, the usual refusal, pays for no pick.
    if (!cands.some(isRoutable) || this.saturationOf(cands) >= limit) return undefined;
    const p = this.pickFor(basis, cands, []);
    if (!p) return undefined;
    const e = this.endpoints.get(p.chosen.spec.id)!;
    // A half-open breaker's next request is its probe, which only the pool's own decision makes.
    if (this.breakers.state(e.spec.id) !== "closed") return undefined;
    const slot: Reserved = {
      endpoint: e.spec.id,
      route: p.tier,
      channel,
      tokens: this.charge(basis, e.spec.id).tokens,
      expiresAt: now + GRANT_HOLD_MS,
    };
    e.inflight++;
    e.reserved++;
    e.tokens += slot.tokens;
    const saturation = this.saturationOf(this.candidates());
    if (saturation >= limit) {
      this.freeSlot(slot);
      return undefined;
    }
    const id = `${this.grantPrefix}${++this.grantSeq}`;
    this.reserved.set(id, slot);
    this.grantsByChannel.set(channel, (this.grantsByChannel.get(channel) ?? 0) + 1);
    this.grantCounters.issued++;
    return {
      id,
      endpoint: e.spec,
      alternates: p.alternates.map((c) => c.spec),
      route: p.tier,
      prefix: basis.prefix,
      location: basis.location,
      endpointsVersion: this.endpointsVersion,
      saturation,
    };
  }

  /**
   * A request an isolate admitted from a grant: its slot becomes the
   * request's lease, charged and recorded as a decision of the pool's
   * would be. A grant the pool no longer holds (told late, or this
   * pool started since) is charged anew on its endpoint: the request runs
   * there either way.
   */
  useGrant(use: GrantUse, now: number): void {
    this.clock = now;
    const slot = this.unreserve(use.grant);
    if (!slot && use.resent) return;
    this.countEstimated(use.req);
    const e = this.endpoints.get(slot?.endpoint ?? use.endpoint);
    if (!e) return;
    if (slot) this.grantCounters.used++;
    else this.grantCounters.late++;
    // A decision that landed here, as the pool's own do: the load tier's turn moves on.
    this.turn++;
    this.hold(e, use.grant, use.req, this.bandOf(use.req.band), slot?.route ?? "load", slot);
    this.drain();
  }

  /** Grants set aside for the channel and not yet used, given back or expired. */
  grantsHeldBy(channel: string): number {
    return this.grantsByChannel.get(channel) ?? 0;
  }

  /** A grant given back unused: its slot is free. */
  returnGrant(id: string, now: number): void {
    this.clock = now;
    const slot = this.unreserve(id);
    if (!slot) return;
    this.grantCounters.returned++;
    this.freeSlot(slot);
    this.drain();
  }

  private unreserve(id: string): Reserved | undefined {
    const slot = this.reserved.get(id);
    if (!slot) return undefined;
    this.reserved.delete(id);
    const n = (this.grantsByChannel.get(slot.channel) ?? 1) - 1;
    if (n > 0) this.grantsByChannel.set(slot.channel, n);
    else this.grantsByChannel.delete(slot.channel);
    return slot;
  }

  private freeSlot(slot: Reserved): void {
    const e = this.endpoints.get(slot.endpoint);
    if (!e) return;
    e.inflight = Math.max(0, e.inflight - 1);
    e.reserved = Math.max(0, e.reserved - 1);
    e.tokens = Math.max(0, e.tokens - slot.tokens);
  }

  private free(lease: Held): void {
    const e = this.endpoints.get(lease.endpoint);
    if (!e) return;
    e.inflight = Math.max(0, e.inflight - 1);
    e.tokens = Math.max(0, e.tokens - lease.tokens);
    if (!lease.prefilling) return;
    e.prefilling = Math.max(0, e.prefilling - 1);
    e.prefillLoad = Math.max(0, e.prefillLoad - lease.prefillWeight);
  }

  /** Expires queued requests and forgotten leases, and re-checks what time alone changes (staleness, cooldowns). */
  tick(now: number): void {
    this.clock = now;
    for (const w of this.flow.expire(now)) {
      this.count(w.band).expired++;
      w.item.respond(
        refusal(
          503,
          "queue_timeout",
          `The request waited ${Math.round((now - w.enqueuedAt) / 1000)} s in band ${w.band} without capacity for model ${this.model} (queue_ttl).`,
          1_000,
        ),
      );
    }
    // Leases are held in the order granted, all for the same span: the first not yet due ends the scan.
    for (const [id, lease] of this.held) {
      if (lease.expiresAt > now) break;
      this.held.delete(id);
      this.free(lease);
      // No verdict will come: a breaker's probe must not stay out forever.
      this.breakers.onAbandon(lease.endpoint);
    }
    for (const [id, slot] of this.reserved) {
      if (slot.expiresAt > now) break;
      this.unreserve(id);
      this.grantCounters.expired++;
      this.freeSlot(slot);
    }
    for (const [id, until] of this.tombstones) if (until <= now) this.tombstones.delete(id);
    this.drain();
  }

  /** When `tick` should next run, or undefined if nothing waits on time. */
  nextWakeAt(): number | undefined {
    let at = Number.POSITIVE_INFINITY;
    if (this.flow.size > 0) at = Math.min(this.flow.nextDeadline() ?? at, this.clock + TICK_WHILE_QUEUED_MS);
    const oldest = this.held.values().next().value;
    if (oldest) at = Math.min(at, oldest.expiresAt);
    const grant = this.reserved.values().next().value;
    if (grant) at = Math.min(at, grant.expiresAt);
    if (this.tombstones.size > 0) at = Math.min(at, this.clock + TOMBSTONE_MS);
    return Number.isFinite(at) ? at : undefined;
  }

  /** Lets queued requests go while the highest waiting band is under its ceiling. */
  private drain(): void {
    while (this.flow.size > 0) {
      const cands = this.candidates();
      if (!cands.some(isRoutable)) return;
      const w = this.flow.next(this.saturationOf(cands));
      if (!w) return;
      this.dispatch(w, cands);
    }
  }

  private dispatch(w: Waiter<Pending>, cands: Scored[]): void {
    const { req, respond } = w.item;
    const rejections: Rejection[] = [];
    const p = this.pickFor(req, cands, rejections);
    this.turn++;
    this.lastRejections = rejections;
    if (!p) {
      this.count(w.band).noCapacity++;
      respond(
        refusal(503, "no_capacity", `No endpoint for model ${this.model} can take requests now.`, 1_000),
      );
      return;
    }
    const chosen = this.endpoints.get(p.chosen.spec.id)!;
    this.breakers.onAttempt(chosen.spec.id);
    const prefilling = this.hold(chosen, req.id, req, w.band, p.tier, undefined);
    const saturation = this.saturationOf(cands);
    respond({
      ok: true,
      lease: {
        id: req.id,
        endpoint: chosen.spec,
        alternates: p.alternates.map((c) => c.spec),
        route: p.tier,
        band: w.band,
        queuedMs: this.clock - w.enqueuedAt,
        saturation,
        ...(prefilling ? { firstTokenNote: this.noteUrgency(saturation) } : {}),
      },
    });
  }

  /**
   * Counts a request in flight on `e` under lease `id`, as the decision of
   * this turn: its predicted demand charged, its session pinned and its
   * prompt's blocks recorded there, its band and route counted. A grant's
   * `slot`, already counted in flight, becomes the request's, re-charged
   * with its real demand. Returns whether it counts as prefilling.
   */
  private hold(
    e: EndpointState,
    id: string,
    req: AdmitRequest,
    band: string,
    tier: RouteTier,
    slot: Reserved | undefined,
  ): boolean {
    const { tokens, prompt } = this.charge(req, e.spec.id);
    const prefilling = req.demand?.reportsFirstToken === true;
    const prefillWeight = prefilling ? prefillWeightOf(prompt) : 0;
    if (slot) e.reserved = Math.max(0, e.reserved - 1);
    else e.inflight++;
    e.tokens += tokens - (slot?.tokens ?? 0);
    if (prefilling) e.prefilling++;
    e.prefillLoad += prefillWeight;
    e.lastPick = this.turn;
    this.held.set(id, {
      endpoint: e.spec.id,
      band,
      tokens,
      prefilling,
      prefillWeight,
      expiresAt: this.clock + this.settings.timeouts.total + LEASE_GRACE_MS,
    });
    if (req.session) this.sessions.pin(req.session, e.spec.id, this.clock);
    this.prefix.record(e.spec.id, req.prefix);
    this.routes[tier]++;
    this.recordRouted(e.spec.site, band);
    return prefilling;
  }

  private pickFor(req: AdmitRequest, cands: Scored[], rejections: Rejection[]): Pick | undefined {
    const session = req.session ? this.sessions.get(req.session, this.clock) : undefined;
    return pick(
      cands,
      {
        policy: req.policy,
        sessionEndpoint: session,
        prefixBlocks: req.prefix.length,
        prefixMatch: (eligible) => this.prefix.match(req.prefix, eligible),
        sessionLoadFactor: this.settings.scoring.session_load_factor,
        alternates: this.settings.retries,
        random: this.random,
        turn: this.turn,
        sites: {
          order: preferredSites(this.settings.sites, req.location),
          warmShare: (site) => this.warmup.share(site, this.clock, this.settings.sites.warmup),
          healthy: (site) => this.warmup.isHealthy(site),
        },
      },
      rejections,
    );
  }

  private recordRouted(site: string | undefined, band: string): void {
    const name = site ?? "default";
    this.routedBySite.set(name, (this.routedBySite.get(name) ?? 0) + 1);
    this.routedRecently.add(name, this.clock);
    this.count(band).admitted++;
  }

  /**
   * Whether this stream's first token should reach the pool at once (a
   * call of its own) or may ride with its isolate's next call. It changes
   * admission only where a band waits or is near its ceiling; elsewhere a
   * call of its own would be a third call per request for nothing (below
   * half the lowest ceiling, it takes many admits anywhere to reach it, and
   * each of this isolate's own carries the note).
   */
  private noteUrgency(saturation: number): "now" | "with-next-call" {
    return this.flow.size > 0 || saturation >= this.lowestCeiling() / 2 ? "now" : "with-next-call";
  }

  private lowestCeiling(): number {
    return Math.min(...this.settings.admission.bands.map((b) => b.saturation_ceiling));
  }

  /**
   * Whether releases and first-token notes should reach the pool at once,
   * by the same rule as a stream's first token at its grant, but as things
   * stand now: each answer to an isolate's call carries it (`hurry`), so a
   * release of a lease granted when the pool was idle does not wait once
   * a burst has filled it.
   */
  notesWantedNow(now: number): boolean {
    this.clock = now;
    if (this.flow.size > 0) return true;
    const cands = this.candidates();
    return cands.some(isRoutable) && this.noteUrgency(this.saturationOf(cands)) === "now";
  }

  /**
   * The tokens a request will newly hold on the endpoint: its answer, and its prompt less the leading
   * blocks the endpoint already caches (resident and shared, and the scraped KV use counts them).
   * Past the hashed head (prefix-hash.ts stops at MAX_BLOCKS, ~4k tokens) the index knows
   * nothing, so the rest of the prompt is taken to be cached in the head's proportion: an
   * 8,000-token system prompt whose head the engine holds is not charged in full on every
   * turn, which held the shared-prefix simulation to 56 req/s instead of 64 (docs/routing.md).
   */
  private charge(req: AdmitRequest, endpoint: string): { tokens: number; prompt: number } {
    const d = req.demand;
    const output = d?.outputTokens ?? this.settings.scoring.assumed_output_tokens;
    if (!d || d.promptTokens === 0) return { tokens: output, prompt: 0 };
    const run = this.prefix.heldRun(endpoint, req.prefix);
    const hashed = Math.min(d.promptTokens, req.prefix.length * TOKENS_PER_BLOCK);
    const head = Math.max(0, hashed - run * TOKENS_PER_BLOCK);
    const share = req.prefix.length > 0 ? run / req.prefix.length : 0;
    const prompt = head + (d.promptTokens - hashed) * (1 - share);
    return { tokens: output + prompt, prompt };
  }

  private candidates(): Scored[] {
    const s = this.settings;
    const loads: (LoadSample | undefined)[] = [];
    for (const e of this.endpoints.values()) loads.push(e.load);
    const scraped = feedIsLive(loads, s.stale_after, this.clock);
    const out: Scored[] = [];
    for (const e of this.endpoints.values()) {
      const g = signals(
        {
          inflight: e.inflight,
          tokens: e.tokens,
          prefillLoad: e.prefillLoad,
          weight: e.spec.weight,
          capacity: e.spec.capacity,
          load: e.load,
        },
        s.scoring,
        s.stale_after,
        this.clock,
        scraped,
      );
      out.push({
        spec: e.spec,
        state: e.load?.state,
        breaker: this.breakers.state(e.spec.id),
        probing: this.breakers.probing(e.spec.id),
        saturation: engineSaturation(g),
        admission: saturationOf(g),
        pressure: e.inflight / e.spec.weight,
        lastPick: e.lastPick,
        stale: scraped && e.load !== undefined && this.clock - e.load.at > s.stale_after,
      });
    }
    const health = siteHealth(out.map((c) => ({ site: siteOf(c), routable: isRoutable(c), stale: c.stale })));
    for (const [site, healthy] of health) this.warmup.observe(site, healthy, this.clock);
    return out;
  }

  /**
   * The mean over routable endpoints with fresh load: a stale one sits at
   * saturation 1 and takes no new request, but counted here it would hold
   * the lower bands out on the live ones (a stale site of two made the pool
   * 0.5 and bronze waited everywhere). If only stale ones are routable, they count.
   */
  private saturationOf(cands: readonly Scored[]): number {
    const fresh: number[] = [];
    const stale: number[] = [];
    for (const c of cands) if (isRoutable(c)) (c.stale ? stale : fresh).push(c.admission);
    return poolSaturation(fresh.length > 0 ? fresh : stale);
  }

  private bandOf(name: string): string {
    const bands = this.settings.admission.bands;
    return bands.some((b) => b.name === name) ? name : this.settings.admission.default_band;
  }

  private count(band: string): BandCounters {
    let c = this.counters.get(band);
    if (!c) {
      c = { admitted: 0, queued: 0, full: 0, expired: 0, abandoned: 0, noEndpoints: 0, noCapacity: 0 };
      this.counters.set(band, c);
    }
    return c;
  }

  status(now: number): PoolStatus {
    this.clock = now;
    const cands = this.candidates();
    const s = this.settings;
    const loads = [...this.endpoints.values()].map((e) => e.load);
    return {
      model: this.model,
      endpointsVersion: this.endpointsVersion,
      saturation: cands.some(isRoutable) ? this.saturationOf(cands) : null,
      loadFeed: loads.every((l) => !l) ? "none" : feedIsLive(loads, s.stale_after, now) ? "live" : "stale",
      leases: this.held.size,
      sessions: this.sessions.size,
      failOpens: this.failOpens,
      grants: { ...this.grantCounters, outstanding: this.reserved.size },
      calls: 0,
      estimated: { ...this.estimated },
      bands: [...s.admission.bands]
        .sort((a, b) => b.priority - a.priority)
        .map((b) => ({
          name: b.name,
          ceiling: b.saturation_ceiling,
          depth: this.flow.depth(b.name),
          ...this.count(b.name),
        })),
      routes: { ...this.routes },
      routedBySite: Object.fromEntries(this.routedBySite),
      routedLastMinuteBySite: this.routedRecently.snapshot(now),
      endpoints: cands.map((c) => {
        const e = this.endpoints.get(c.spec.id)!;
        return {
          id: c.spec.id,
          site: c.spec.site ?? "default",
          url: c.spec.url,
          pool: c.spec.spillGroup,
          priority: c.spec.priority,
          weight: c.spec.weight,
          state: c.state ?? "unscraped",
          inflight: e.inflight - e.reserved,
          reserved: e.reserved,
          prefilling: e.prefilling,
          tokens: e.tokens,
          maxSeqs: c.spec.capacity?.maxSeqs ?? null,
          kvTokens: c.spec.capacity?.kvTokens ?? null,
          saturation: c.admission,
          breaker: c.breaker,
          breakerReason: c.breaker === "closed" ? null : this.breakers.reason(c.spec.id),
          loadAgeMs: e.load ? now - e.load.at : null,
          waiting: e.load?.waiting ?? null,
          running: e.load?.running ?? null,
          kvUsage: e.load?.kvUsage ?? null,
          prefixBlocks: this.prefix.blocksHeld(c.spec.id),
        };
      }),
      lastRejections: this.lastRejections,
    };
  }
}

function refusal(status: 429 | 503, code: RefusalCode, message: string, retryAfterMs: number): Admission {
  return { ok: false, status, code, message, retryAfterMs };
}

function bandSpecs(s: RouterConfig) {
  return s.admission.bands.map((b) => ({
    name: b.name,
    priority: b.priority,
    ceiling: b.saturation_ceiling,
  }));
}

function flowOptions(s: RouterConfig) {
  return {
    enabled: s.admission.enabled,
    capacityPerBand: s.admission.queue_capacity_per_band,
    ttlMs: s.admission.queue_ttl,
  };
}
