/**
 * The Worker's side of a model's pool: `admit` (which may wait in the
 * band's queue) and a lease that reports back once, in `waitUntil`, both
 * through the isolate's channel to the pool, which coalesces them with the
 * isolate's other requests' (edge/routing/pool-channel.ts).
 *
 * Fail-open (the anchors' lesson: a router that cannot see load should
 * degrade to a local pick, not to 5xx): if the pool throws, or answers
 * neither lease nor refusal within the queue TTL plus `pool_timeout`, the
 * Worker picks from the KV endpoint set with a PoolCore of its own —
 * in-flight counts of this isolate only, no queue — answers with
 * `x-llmgw-route: fail-open`, and tells the pool how often with its next
 * call, for the pool's `fail_opens` counter.
 */
import { endpointSpec, type RoutingTable } from "../config/catalog.ts";
import type { RouterConfig } from "../config/router.ts";
import type { Env } from "../env.ts";
import { type ApiError, errors } from "../openai-errors.ts";
import { PoolChannel } from "../routing/pool-channel.ts";
import {
  type Admission,
  type AdmitRequest,
  type Lease,
  PoolCore,
  type ReleaseReport,
  type Verdict,
} from "../routing/pool-core.ts";
import { POLL_HOLD_MS } from "../routing/pool-exchange.ts";

export class ClientGone extends Error {}

export interface PoolLease {
  lease: Lease;
  model: string;
  failOpen: boolean;
  /** Records one attempt's verdict; the first report settles the lease. */
  /** An attempt's verdict, and for a failure its reason (the breaker's, if it opens). */
  record(endpoint: string, verdict: Verdict, reason?: string): void;
  /** Sends the verdicts to the pool, once; later calls return the same promise. */
  settle(): Promise<void>;
  /** A stream's first token came: the pool stops counting its prompt as prefill to do. Once. */
  prefilled(): void;
}

const local = new Map<string, { core: PoolCore; settings: RouterConfig }>();
const channels = new Map<string, { channel: PoolChannel; answerWithinMs: number }>();

/** Durable Objects' location hints (docs/deploy.md, "Where the pools live"). */
const LOCATION_HINTS: readonly string[] = ["wnam", "enam", "sam", "weur", "eeur", "apac", "oc", "afr", "me"];
let badHintReported: string | undefined;

/**
 * LLMGW_POOL_LOCATION as a hint, or none. A value that names no region is
 * not passed on, and said once in the log: a pool created without a hint
 * still serves, where a typo would otherwise fail every admission or be
 * ignored without a word.
 */
function locationHint(value: string | undefined): DurableObjectLocationHint | undefined {
  if (!value) return undefined;
  if (LOCATION_HINTS.includes(value)) return value as DurableObjectLocationHint;
  if (badHintReported !== value) {
    badHintReported = value;
    console.error(
      `LLMGW_POOL_LOCATION: "${value}" is not one of ${LOCATION_HINTS.join(", ")}; pools are created without a hint`,
    );
  }
  return undefined;
}

/** The model's pool, created near the GPUs when LLMGW_POOL_LOCATION names a region. */
export function poolOf(env: Env, model: string) {
  const ns = env.MODEL_POOL;
  const hint = locationHint(env.LLMGW_POOL_LOCATION);
  return ns.get(ns.idFromName(model), hint ? { locationHint: hint } : undefined);
}

/**
 * This isolate's channel to the model's pool: one per model, so the
 * isolate's requests share its calls (edge/routing/pool-channel.ts).
 */
function channelOf(env: Env, model: string, settings: RouterConfig): PoolChannel {
  const held = channels.get(model);
  if (held && held.answerWithinMs === settings.pool_timeout) return held.channel;
  const channel = new PoolChannel({
    id: crypto.randomUUID(),
    send: (ex) => poolOf(env, model).exchange(model, ex),
    answerWithinMs: settings.pool_timeout,
    pollHoldMs: POLL_HOLD_MS,
  });
  channels.set(model, { channel, answerWithinMs: settings.pool_timeout });
  return channel;
}

function localPool(model: string, table: RoutingTable, settings: RouterConfig): PoolCore {
  const own: RouterConfig = { ...settings, admission: { ...settings.admission, enabled: false } };
  let entry = local.get(model);
  if (!entry) {
    entry = { core: new PoolCore(model, own), settings };
    local.set(model, entry);
  } else if (entry.settings !== settings) {
    entry.settings = settings;
    entry.core.configure(own, Date.now());
  }
  if (table.endpoints.version > entry.core.version) {
    entry.core.setEndpoints(table.endpoints.version, table.endpointsFor(model).map(endpointSpec), Date.now());
  }
  return entry.core;
}

function handle(
  lease: Lease,
  model: string,
  failOpen: boolean,
  send: (report: ReleaseReport) => Promise<void>,
  sendPrefilled: () => void,
): PoolLease {
  const attempts: ReleaseReport["attempts"] = [];
  let sent: Promise<void> | undefined;
  let prefilled = false;
  return {
    lease,
    model,
    failOpen,
    record(endpoint, verdict, reason) {
      if (!sent) attempts.push({ endpoint, verdict, reason });
    },
    settle() {
      sent ??= send({ attempts }).catch((err) => console.error("pool release failed", model, lease.id, err));
      return sent;
    },
    prefilled() {
      if (prefilled || sent) return;
      prefilled = true;
      sendPrefilled();
    },
  };
}

export interface AdmitInput {
  env: Env;
  model: string;
  table: RoutingTable;
  settings: RouterConfig;
  request: AdmitRequest;
  clientSignal: AbortSignal | undefined;
  /** Keeps work alive after the response (the runtime's waitUntil). */
  defer: (p: Promise<unknown>) => void;
}

/** A lease from the model's pool, or its refusal as the ApiError to answer with. */
export async function admit(input: AdmitInput): Promise<PoolLease> {
  const { model, request, clientSignal } = input;
  if (clientSignal?.aborted) throw new ClientGone();
  const channel = channelOf(input.env, model, input.settings);
  // A grant is used at once: only a call needs ask's bound and watch on the client.
  const answer =
    channel.admitFromGrant(request, input.table.endpoints.version, input.defer) ??
    (await ask(input, channel));
  // The pool could not be reached: the Worker's own pick.
  if ("failOpen" in answer) return answer;
  if (!answer.ok) throw refusalError(answer);
  const lease = answer.lease;
  return handle(
    lease,
    model,
    false,
    (report) => channel.release(lease.id, report),
    // Lost with its call, the note costs only accuracy: the release frees the prompt as well.
    () => input.defer(channel.prefilled(lease.id, lease.firstTokenNote).catch(() => {})),
  );
}

/**
 * The pool's answer to a call, within `queue_ttl` + `pool_timeout`; past
 * that, or with no answer at all, the Worker routes on its own (fail-open).
 */
async function ask(input: AdmitInput, channel: PoolChannel): Promise<Admission | PoolLease> {
  const { request, clientSignal } = input;
  const bound = input.settings.admission.queue_ttl + input.settings.pool_timeout;
  let answer: Admission | "timeout" | "gone";
  let timer: ReturnType<typeof setTimeout> | undefined;
  let onAbort: (() => void) | undefined;
  try {
    answer = await Promise.race([
      channel.admitByCall(request, input.table.endpoints.version, input.defer),
      new Promise<"timeout">((r) => {
        timer = setTimeout(() => r("timeout"), bound);
      }),
      new Promise<"gone">((r) => {
        onAbort = () => r("gone");
        clientSignal?.addEventListener("abort", onAbort, { once: true });
      }),
    ]);
  } catch (err) {
    return failOpen(
      input,
      channel,
      `the pool did not answer: ${err instanceof Error ? err.message : String(err)}`,
    );
  } finally {
    if (timer !== undefined) clearTimeout(timer);
    if (onAbort) clientSignal?.removeEventListener("abort", onAbort);
  }
  if (answer === "gone" || answer === "timeout") {
    // Whatever the pool decides later, this request is not coming.
    input.defer(channel.abandon(request.id).catch(() => {}));
    if (answer === "gone") throw new ClientGone();
    return failOpen(input, channel, `the pool did not answer within ${bound} ms`);
  }
  return answer;
}

function failOpen(input: AdmitInput, channel: PoolChannel, why: string): PoolLease {
  channel.countFailOpen();
  console.warn(`model pool ${input.model} unreachable, routing locally: ${why}`);
  const core = localPool(input.model, input.table, input.settings);
  let answer: Admission | undefined;
  core.admit(input.request, Date.now(), (a) => {
    answer = a;
  });
  if (!answer) throw errors.internal("local pool queued a request with admission off");
  if (!answer.ok) throw refusalError(answer);
  const lease = answer.lease;
  return handle(
    lease,
    input.model,
    true,
    async (report) => {
      core.release(lease.id, report, Date.now());
    },
    () => core.prefilled(lease.id, Date.now()),
  );
}

export function refusalError(a: Extract<Admission, { ok: false }>): ApiError {
  if (a.status === 429) return errors.rateLimited(a.message, a.code, a.retryAfterMs);
  return errors.noCapacity(a.message, a.code);
}
