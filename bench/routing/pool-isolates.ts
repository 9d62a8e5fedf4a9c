/**
 * bench:routing part `isolates`: how many admissions one model's pool takes
 * from 32 isolates, and how many calls it costs, as deployed rather than as
 * workerd on loopback runs it. The real PoolChannel (one per isolate),
 * PoolExchange and PoolCore run on a virtual clock; what the clock models is
 * the part loopback cannot show:
 *
 * - the pool answers one call at a time, each costing a fixed CALL_MS plus
 *   ADMIT_MS per admit and RELEASE_MS per release or first-token note (a Durable Object's ~1,000
 *   calls a second makes a call about 1 ms; the pick measured in part `pick`
 *   is tens of µs);
 * - a call travels ONE_WAY_MS each way (the Worker placed near the pool);
 * - requests arrive as a Poisson stream spread evenly over the isolates;
 *   each is a stream: its first token comes TTFT_MEAN_MS after the lease on
 *   average (the Worker then sends a note), and it holds the lease for a
 *   stream's length before releasing it.
 *
 * Three designs, side by side at each offered rate: every admit, note and
 * release a call of its own (the design before coalescing); one channel per
 * isolate; and the same with grants, where a request like one its isolate
 * just had admitted (the same prompt group) may be admitted from the slot
 * the pool set aside for it, without a call. A design is over its ceiling
 * when its admit wait grows without bound (the pool busy all the time and
 * the queue of calls growing).
 */
import { mulberry32 } from "../../common/rng.ts";
import { renderTable } from "../../common/text-table.ts";
import { routerSchema } from "../../edge/config/router.ts";
import { PoolChannel, type Timer } from "../../edge/routing/pool-channel.ts";
import { PoolCore } from "../../edge/routing/pool-core.ts";
import { POLL_HOLD_MS, PoolExchange } from "../../edge/routing/pool-exchange.ts";
import type { Exchange, ExchangeAnswer } from "../../edge/routing/pool-protocol.ts";
import { percentile } from "../../loadgen/stats.ts";
import { benchEndpoints } from "./endpoints.ts";
import { Timeline } from "./timeline.ts";

const ISOLATES = 32;
const CALL_MS = 0.9;
const ADMIT_MS = 0.03;
const RELEASE_MS = 0.005;
const ONE_WAY_MS = 0.5;
const HOLD_MEAN_MS = 2_000;
const TTFT_MEAN_MS = 100;
const MEASURE_MS = 10_000;
const WARMUP_MS = 3_000;
/** How long after the window a request may still be admitted and counted. */
const CUTOFF_MS = 5_000;
const RATES = [250, 500, 1_000, 2_000, 5_000, 8_000];

const DESIGNS = ["a call each", "coalesced", "coalesced, grants"] as const;
type Design = (typeof DESIGNS)[number];

interface Outcome {
  admitted: number;
  /** Of those, admitted from a grant. */
  granted: number;
  calls: number;
  busyMs: number;
  waits: number[];
  /** Arrived in the window and not admitted yet. */
  pending: Set<number>;
}

/** Runs the pool, the isolates and their requests on one virtual clock. */
async function run(design: Design, rate: number, seed: number): Promise<Outcome> {
  const tl = new Timeline();
  const random = mulberry32(seed);
  // Engines far above the offered load: this measures the pool, not them.
  const settings = routerSchema.parse({
    scoring: { target_prefilling: 1_000_000 },
    admission: { grants: design === "coalesced, grants" },
  });
  const core = new PoolCore("m", settings, random);
  // Capacity far above the offered load: this measures the pool, not the engines.
  const endpoints = benchEndpoints(64).map((e) => ({ ...e, capacity: { maxSeqs: 1_000_000 } }));
  core.setEndpoints(1, endpoints, 0);
  const desk = new PoolExchange(core);
  const out: Outcome = { admitted: 0, granted: 0, calls: 0, busyMs: 0, waits: [], pending: new Set() };
  const measuring = () => tl.now >= WARMUP_MS && tl.now < WARMUP_MS + MEASURE_MS;

  // The pool: one call at a time, in arrival order.
  let freeAt = 0;
  const send = (ex: Exchange): Promise<ExchangeAnswer> =>
    new Promise((resolve) => {
      const arrives = tl.now + ONE_WAY_MS;
      const start = Math.max(arrives, freeAt);
      const notes = ex.releases.length + (ex.prefilled?.length ?? 0) + (ex.returned?.length ?? 0);
      // A grant's use is recorded as an admit is; the pool's grants for the call's admits and uses are picked as admits are.
      const picks = ex.admits.length + 2 * (ex.used?.length ?? 0);
      const cost = CALL_MS + ADMIT_MS * picks + RELEASE_MS * notes;
      freeAt = start + cost;
      tl.at(freeAt, () => {
        if (measuring()) {
          out.calls++;
          out.busyMs += cost;
        }
        desk.exchange(ex, tl.now, (answer) => tl.at(tl.now + ONE_WAY_MS, () => resolve(answer)));
      });
    });
  const timer = (ms: number): Timer => {
    let cancelled = false;
    return {
      fired: new Promise((r) => tl.at(tl.now + ms, () => !cancelled && r())),
      cancel: () => {
        cancelled = true;
      },
    };
  };
  const channel = (id: string) =>
    new PoolChannel({ id, send, answerWithinMs: 60_000, pollHoldMs: POLL_HOLD_MS, now: () => tl.now, timer });
  const channels = Array.from({ length: ISOLATES }, (_, k) => channel(`isolate-${k}`));
  const prefixes = Array.from({ length: 100 }, (_, g) => Array.from({ length: 16 }, (_, b) => g * 1_000 + b));

  const request = async (n: number) => {
    const isolate = n % ISOLATES;
    const via = () => (design === "a call each" ? channel(`isolate-${isolate}`) : channels[isolate]!);
    const arrived = tl.now;
    const counted = measuring();
    if (counted) out.pending.add(n);
    const a = await via().admit(
      {
        id: `r${n}`,
        band: "gold",
        key: `k${n % 50}`,
        policy: "chat",
        prefix: prefixes[n % prefixes.length]!,
        demand: { promptTokens: 1_000, outputTokens: 200, reportsFirstToken: true },
      },
      1,
    );
    if (!a.ok) throw new Error(`pool refused ${n}: ${a.message}`);
    if (counted) {
      out.admitted++;
      if (a.lease.granted) out.granted++;
      out.waits.push(tl.now - arrived);
      out.pending.delete(n);
    }
    const ttft = -Math.log(1 - random()) * TTFT_MEAN_MS;
    const hold = ttft - Math.log(1 - random()) * HOLD_MEAN_MS;
    const noter = via();
    tl.at(tl.now + ttft, () => void noter.prefilled(a.lease.id, a.lease.firstTokenNote));
    const releaser = via();
    tl.at(tl.now + hold, () => {
      void releaser.release(a.lease.id, { attempts: [{ endpoint: a.lease.endpoint.id, verdict: "ok" }] });
    });
  };

  let next = 0;
  let n = 0;
  const end = WARMUP_MS + MEASURE_MS;
  while (next < end) {
    const k = n++;
    tl.at(next, () => void request(k));
    next += -Math.log(1 - random()) * (1_000 / rate);
  }
  // Every event, then the promise continuations it let run, before the next event.
  while (tl.step()) {
    await new Promise<void>((r) => setImmediate(r));
    if (tl.now > end + CUTOFF_MS) break;
  }
  // Still waiting when the run ends: a wait longer than any measured.
  for (const _ of out.pending) out.waits.push(Number.POSITIVE_INFINITY);
  return out;
}

export async function poolIsolates(): Promise<void> {
  process.stdout.write(
    `\n## One pool, ${ISOLATES} isolates, as deployed (virtual clock: a call ${CALL_MS} ms + ${ADMIT_MS * 1000} µs per admit` +
      ` + ${RELEASE_MS * 1000} µs per release or note, one at a time; ${ONE_WAY_MS} ms each way; streams, first token after ${TTFT_MEAN_MS} ms` +
      ` and leases held ${HOLD_MEAN_MS / 1000} s on average)\n\n`,
  );
  const rows: string[][] = [];
  for (const rate of RATES) {
    for (const design of DESIGNS) {
      const o = await run(design, rate, 7);
      const waits = o.waits.sort((a, b) => a - b);
      const secs = MEASURE_MS / 1000;
      const busy = o.busyMs / MEASURE_MS;
      rows.push([
        String(rate),
        design,
        String(Math.round(o.admitted / secs)),
        String(Math.round(o.calls / secs)),
        o.admitted > 0 ? (o.calls / o.admitted).toFixed(2) : "-",
        o.admitted > 0 ? `${Math.round((100 * o.granted) / o.admitted)} %` : "-",
        `${Math.round(Math.min(1, busy) * 100)} %`,
        fmt(percentile(waits, 50)),
        fmt(percentile(waits, 99)),
      ]);
    }
  }
  process.stdout.write(
    `${renderTable(
      [
        "offered/s",
        "design",
        "admitted/s",
        "pool calls/s",
        "calls per admission",
        "from grants",
        "pool busy",
        "admit wait p50",
        "p99",
      ],
      rows,
    ).replace(/^/gm, "  ")}\n`,
  );
}

function fmt(ms: number | null): string {
  if (ms === null) return "-";
  if (!Number.isFinite(ms)) return `> ${CUTOFF_MS / 1000} s`;
  return ms >= 1_000 ? `${(ms / 1000).toFixed(1)} s` : `${ms.toFixed(1)} ms`;
}
