import { errors } from "../openai-errors.ts";
import { ClientGone } from "../pool/client.ts";
import { gatewayFailure } from "../unhandled.ts";
import {
  type Call,
  ClientSide,
  type Committed,
  connect,
  errorEventFor,
  holdFirstToken,
  isFailure,
  newCall,
  readWhole,
  relay,
} from "./attempt.ts";
import type { Target } from "./attempt-plan.ts";
import {
  clientLeft,
  type Failure,
  type Outcome,
  outcomeOf,
  reasonOf,
  type Verdicted,
  type Where,
} from "./failure.ts";
import type { ProxyInput } from "./input.ts";

export type { Outcome } from "./failure.ts";
/**
 * Sends one OpenAI request to an engine and streams the answer back.
 *
 * Attempts: the endpoints come from the plan (the pool's lease: its choice
 * and ranked alternates, then the fallback models' pools), each tried at
 * most once. A failed attempt is retried only while the client has no byte
 * of the answer: a dead, erroring or silent engine before a stream's first
 * token is still retried. When the client gets its 200 is `stream_commit`'s:
 * at the first engine's headers (the last failure before the first token
 * then becomes an error event in that stream), or only with the first token
 * (it then gets a status of its own). After the first token, failures become
 * an SSE error event and a clean close (proxy/attempt.ts). Every attempt's
 * verdict goes to its lease — the proxy never touches breakers or counts
 * itself.
 */
export type { ApiPath, ProxyInput, Targets } from "./input.ts";

export interface ProxyResult {
  response: Response;
  /** Resolves when the last byte has been relayed (or the stream was cut off). */
  outcome: Promise<Outcome>;
}

export async function proxy(input: ProxyInput): Promise<ProxyResult> {
  const tries = new Tries(input);
  for (let next = await tries.next(); next; next = await tries.next()) {
    const { target, call } = next;
    const r = await attempt(call);
    if (isFailure(r)) {
      tries.failed(target, r);
      if (!r.retryable) return tries.refused(r, call.headers, target.endpoint.id);
      continue;
    }
    if (r instanceof Response) return committedAtHeaders(tries, { target, call, res: r });
    // A stream committed at its first token (stream_commit: first_token): its prompt is computed.
    if (input.stream) target.lease.prefilled();
    return { response: r.response, outcome: tries.settled(target, r.outcome) };
  }
  const last = tries.last ?? {
    error: errors.noCapacity(
      `No endpoint for model ${String(input.body.model)} could be tried.`,
      "no_capacity",
    ),
    retryable: false,
    verdict: "ok",
  };
  return tries.refused(last, tries.baseHeaders(), undefined);
}

/**
 * One attempt up to what the client's response needs: the whole answer
 * (non-streamed), the engine's headers (a stream committed at them), or the
 * first token (a stream committed at it).
 */
async function attempt(call: Call): Promise<Committed | Response | Failure> {
  if (!call.input.stream) {
    // A non-streamed answer runs on when its client leaves, and is charged
    // what the engine reports (docs/edge.md).
    const res = await connect(call);
    return isFailure(res) ? res : readWhole(call, res);
  }
  if (call.input.settings.stream_commit === "headers") return untilClientLeaves(call, () => connect(call));
  const held = await untilClientLeaves(call, async () => {
    const res = await connect(call);
    return isFailure(res) ? res : holdFirstToken(call, res);
  });
  if (isFailure(held)) return held;
  const client = new ClientSide(call.input);
  return { response: client.response(call.headers), outcome: relay(call, held, client) };
}

/**
 * Until a stream's client has its response, a client that leaves aborts
 * the attempt at once: otherwise the engine would work for nobody, and the
 * lease stay held, until the first token came or first_token ran out.
 */
async function untilClientLeaves<T>(call: Call, step: () => Promise<T | Failure>): Promise<T | Failure> {
  const signal = call.input.clientSignal;
  if (signal?.aborted) return clientLeft();
  signal?.addEventListener("abort", call.abort, { once: true });
  try {
    const r = await step();
    return isFailure(r) && signal?.aborted ? clientLeft() : r;
  } finally {
    signal?.removeEventListener("abort", call.abort);
  }
}

/** An attempt whose engine sent its headers (a 2xx). */
interface Accepted {
  target: Target;
  call: Call;
  res: Response;
}

/**
 * A stream committed at its engine's headers: the client has its 200 while
 * the engine computes the prompt. Until the first token the request may
 * still move to another endpoint, the client none the wiser; only when none
 * is left does it hear the last failure, as the stream's error event.
 */
function committedAtHeaders(tries: Tries, first: Accepted): ProxyResult {
  const client = new ClientSide(tries.input);
  const response = client.response(first.call.headers);
  const ended = (last: Failure): Outcome => {
    const end =
      last.verdict === "abandon" ? { kind: "left" as const } : { kind: "cut" as const, failure: last };
    client.close(end.kind === "cut" ? errorEventFor(tries.input.apiPath, last.error.body()) : "");
    return outcomeOf(tries.where(), end);
  };
  const outcome = (async (): Promise<Outcome> => {
    let at: Accepted | Failure | undefined = first;
    while (at && !isFailure(at)) {
      const { target, call, res } = at;
      client.whenGone(call.abort);
      const held = await holdFirstToken(call, res);
      if (!isFailure(held)) {
        target.lease.prefilled();
        return tries.settled(target, relay(call, held, client));
      }
      const f = tries.failedCommitted(client, target, held);
      at = f.retryable ? await tries.accepted(client) : f;
    }
    return ended(at ?? tries.last!);
  })().catch((err: unknown) => {
    // A fallback's pool, asked on the way, may throw: the client left while
    // it queued, or the edge itself failed. The stream still ends, and the
    // request is still charged and its leases released.
    if (err instanceof ClientGone || client.gone) return ended(clientLeft());
    console.error("the stream failed before its first token", tries.input.requestId, err);
    return ended({ error: gatewayFailure(tries.input.requestId), retryable: false, verdict: "ok" });
  });
  return { response, outcome };
}

/**
 * How the lease came: the pool's answer to a call, a slot it had set aside
 * for the isolate (a grant, used without a call), or the isolate's own pick
 * while the pool could not be reached.
 */
function admittedBy(lease: Target["lease"]): "pool" | "grant" | "fail-open" {
  if (lease.failOpen) return "fail-open";
  return lease.lease.granted ? "grant" : "pool";
}

/** One request's attempts: their numbering, their headers, and what each told its lease. */
class Tries {
  attempts = 0;
  last: Failure | undefined;
  private lastTarget: Target | undefined;
  private readonly started = Date.now();

  constructor(readonly input: ProxyInput) {}

  baseHeaders(): Record<string, string> {
    return {
      "x-request-id": this.input.requestId,
      "x-llmgw-band": this.input.band,
      "x-llmgw-attempts": String(this.attempts),
    };
  }

  async next(): Promise<{ target: Target; call: Call } | undefined> {
    const target = await this.input.targets.take();
    if (!target) return undefined;
    this.attempts++;
    const { lease } = target;
    const headers = {
      ...this.baseHeaders(),
      "x-llmgw-endpoint": target.endpoint.id,
      "x-llmgw-route": lease.failOpen ? "fail-open" : lease.lease.route,
      "x-llmgw-admitted": admittedBy(lease),
      "x-llmgw-queued-ms": String(Math.round(lease.lease.queuedMs)),
    };
    const call = newCall(this.input, target.endpoint, target.model, this.attempts, headers, this.started);
    return { target, call };
  }

  /**
   * The next endpoint whose engine sends its headers, for a stream already
   * committed: each failure on the way is told to its lease, and the first
   * that may not be retried (the client gone, an engine's 4xx) ends it.
   */
  async accepted(client: ClientSide): Promise<Accepted | Failure | undefined> {
    for (let next = await this.next(); next; next = await this.next()) {
      const { target, call } = next;
      client.whenGone(call.abort);
      const res = await connect(call);
      if (!isFailure(res)) return { target, call, res };
      const f = this.failedCommitted(client, target, res);
      if (!f.retryable) return f;
    }
    return undefined;
  }

  failed(target: Target, f: Failure): void {
    target.lease.record(target.endpoint.id, f.verdict, reasonOf(f));
    this.last = f;
    this.lastTarget = target;
  }

  /**
   * A failed attempt of a stream whose client has its 200: once the client
   * has gone, its going is what ended the attempt, whatever the engine did
   * on the way out, so the endpoint's breaker hears neither a success nor a
   * failure.
   */
  failedCommitted(client: ClientSide, target: Target, f: Failure): Failure {
    const recorded = client.gone ? clientLeft() : f;
    this.failed(target, recorded);
    return recorded;
  }

  /** Where the request ended: the endpoint tried last, after every attempt. */
  where(): Where {
    const t = this.lastTarget;
    return { endpoint: t?.endpoint.id, model: t?.model, attempts: this.attempts };
  }

  settled(target: Target, outcome: Promise<Verdicted>): Promise<Outcome> {
    return outcome.then((o) => {
      target.lease.record(target.endpoint.id, o.verdict, o.why);
      return o;
    });
  }

  refused(f: Failure, headers: Record<string, string>, endpoint: string | undefined): ProxyResult {
    return {
      response: f.error.toResponse(headers),
      outcome: Promise.resolve(
        outcomeOf({ endpoint, model: undefined, attempts: this.attempts }, { kind: "refused", failure: f }),
      ),
    };
  }
}
