import { errors } from "../openai-errors.ts";
import {
  type Call,
  type Committed,
  connect,
  type Held,
  holdFirstToken,
  isFailure,
  newCall,
  readWhole,
  relay,
} from "./attempt.ts";
import { clientLeft, type Failure, type Outcome, outcomeOf, reasonOf } from "./failure.ts";
import type { ProxyInput } from "./input.ts";

export type { Outcome } from "./failure.ts";
/**
 * Sends one OpenAI request to an engine and streams the answer back.
 *
 * Attempts: the endpoints come from the plan (the pool's lease: its choice
 * and ranked alternates, then the fallback models' pools), each tried at
 * most once. A failed attempt is retried only while nothing has been sent
 * to the client: for a stream the client's response starts with the first
 * data event, so a dead, erroring or silent engine before the first token
 * is still retried (or answered with a proper status); after it, failures
 * become an SSE error event and a clean close (proxy/attempt.ts). Every
 * attempt's verdict goes to its lease — the proxy never touches breakers
 * or counts itself.
 */
export type { ApiPath, ProxyInput, Targets } from "./input.ts";

export interface ProxyResult {
  response: Response;
  /** Resolves when the last byte has been relayed (or the stream was cut off). */
  outcome: Promise<Outcome>;
}

export async function proxy(input: ProxyInput): Promise<ProxyResult> {
  const started = Date.now();
  let attempts = 0;
  let last: Failure | undefined;
  const baseHeaders = { "x-request-id": input.requestId, "x-llmgw-band": input.band };

  for (let t = await input.targets.take(); t; t = await input.targets.take()) {
    attempts++;
    const { lease } = t;
    const headers = {
      ...baseHeaders,
      "x-llmgw-endpoint": t.endpoint.id,
      "x-llmgw-attempts": String(attempts),
      "x-llmgw-route": lease.failOpen ? "fail-open" : lease.lease.route,
      "x-llmgw-queued-ms": String(Math.round(lease.lease.queuedMs)),
    };
    const r = await attempt(newCall(input, t.endpoint, t.model, attempts, headers, started));
    if (!isFailure(r)) {
      // A stream is held until its first token: its prompt is computed.
      if (input.stream) lease.prefilled();
      const outcome = r.outcome.then((o) => {
        lease.record(t.endpoint.id, o.verdict, o.why);
        return o;
      });
      return { response: r.response, outcome };
    }
    lease.record(t.endpoint.id, r.verdict, reasonOf(r));
    last = r;
    if (!r.retryable) return refused(r, headers, t.endpoint.id, attempts);
  }
  last ??= {
    error: errors.noCapacity(
      `No endpoint for model ${String(input.body.model)} could be tried.`,
      "no_capacity",
    ),
    retryable: false,
    verdict: "ok",
  };
  return refused(last, { ...baseHeaders, "x-llmgw-attempts": String(attempts) }, undefined, attempts);
}

async function attempt(call: Call): Promise<Committed | Failure> {
  if (!call.input.stream) {
    // A non-streamed answer runs on when its client leaves, and is charged
    // what the engine reports (docs/edge.md).
    const res = await connect(call);
    return isFailure(res) ? res : readWhole(call, res);
  }
  const held = await firstToken(call);
  return isFailure(held) ? held : relay(call, held);
}

/**
 * Until a stream's first token, a client that leaves aborts the attempt at
 * once: otherwise the engine would work for nobody, and the lease stay
 * held, until that token came or first_token ran out.
 */
async function firstToken(call: Call): Promise<Held | Failure> {
  const signal = call.input.clientSignal;
  if (signal?.aborted) return clientLeft();
  signal?.addEventListener("abort", call.abort, { once: true });
  try {
    const res = await connect(call);
    const held = isFailure(res) ? res : await holdFirstToken(call, res);
    return isFailure(held) && signal?.aborted ? clientLeft() : held;
  } finally {
    signal?.removeEventListener("abort", call.abort);
  }
}

function refused(
  f: Failure,
  headers: Record<string, string>,
  endpoint: string | undefined,
  attempts: number,
): ProxyResult {
  return {
    response: f.error.toResponse(headers),
    outcome: Promise.resolve(
      outcomeOf({ endpoint, model: undefined, attempts }, { kind: "refused", failure: f }),
    ),
  };
}
