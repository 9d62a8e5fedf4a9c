/**
 * One inference request, as the steps it goes through:
 *
 *   caller (401) → body (413, 415, 400) → model (404, 403) → band (400,
 *   403) → session (400) → the key's ledger (401; 429 for RPM/TPM/budget, or for running
 *   requests that may spend what is left) → admission by the model's pool
 *   (429, 503; the queue) → proxy (retries, fallbacks; 503, 504, the
 *   engine's) → charge and release, after the response, in waitUntil.
 *
 * Nothing reaches an engine before every check before it has passed. Each
 * step is a function of its own below, in that order.
 */
import type { Context } from "hono";
import type { z } from "zod";
import { AccessLog } from "./access-log.ts";
import { caller } from "./caller.ts";
import type { RoutingTable } from "./config/catalog.ts";
import { type EdgeConfig, edgeConfig } from "./config/store.ts";
import type { Env } from "./env.ts";
import { reservationFor } from "./keys/reservations.ts";
import { allowedChain, type KeyRecord, modelAllowed, resolveBand } from "./keys/rules.ts";
import { admitKey, charge } from "./keys/usage.ts";
import { requestLocation } from "./location.ts";
import { ApiError, errors } from "./openai-errors.ts";
import { admit, ClientGone } from "./pool/client.ts";
import { estimateTally } from "./pool/estimate-tally.ts";
import { AttemptPlan } from "./proxy/attempt-plan.ts";
import { keyedUpstream } from "./proxy/keyed-upstream.ts";
import { type ApiPath, type Outcome, proxy } from "./proxy/proxy.ts";
import { parseJsonBody, readBodyLimited, validate } from "./request-schema.ts";
import { chatViewOf } from "./routing/conversation.ts";
import { predictDemand } from "./routing/demand.ts";
import { requestPrefixHashes } from "./routing/prefix-hash.ts";
import type { Demand, Location } from "./routing/types.ts";
import { newRequestId, unhandledError } from "./unhandled.ts";

type Ctx = Context<{ Bindings: Env }>;
type Schema = z.ZodType<Record<string, unknown> & { model: string }>;

const MAX_SESSION_ID = 256;

/** What the steps after the checks need of a request. */
interface Inbound {
  id: string;
  apiPath: ApiPath;
  key: KeyRecord;
  body: Record<string, unknown> & { model: string };
  /** It asks an engine to generate (all but embeddings). */
  generates: boolean;
  /** What the estimates read: the body, or the chat request a Responses request stands for. */
  estimating: Readonly<Record<string, unknown>>;
  /** Bytes of the body as sent (a bound on its tokens, for the ledger). */
  size: number;
  /** The canonical model, then its fallbacks. */
  chain: string[];
  band: string;
  session: string | undefined;
  location: Location | undefined;
}

async function body(c: Ctx, schema: Schema, config: EdgeConfig) {
  const bytes = await readBodyLimited(c.req.raw, config.settings.max_body_bytes);
  return { parsed: validate(schema, parseJsonBody(bytes)), size: bytes.byteLength };
}

/** The canonical model and those of its fallbacks the key may use, if the key may use it. */
function model(table: RoutingTable, requested: string, key: KeyRecord): string[] {
  const canonical = table.resolve(requested);
  if (!canonical) throw errors.modelNotFound(requested);
  if (!modelAllowed(key, canonical, requested)) {
    throw errors.forbidden(`This key may not use the model \`${requested}\`.`, "model_not_allowed", "model");
  }
  return allowedChain(key, table.chain(canonical), (name) => table.resolve(name));
}

function band(c: Ctx, key: KeyRecord, config: EdgeConfig): string {
  const a = config.settings.admission;
  const value = c.req.header(a.band_header);
  const requested = value === undefined ? null : { header: a.band_header, value };
  return resolveBand(key, requested, a.bands, a.default_band).name;
}

function session(c: Ctx, config: EdgeConfig): string | undefined {
  const header = config.settings.session_header;
  const id = c.req.header(header)?.trim();
  if (!id) return undefined;
  if (id.length > MAX_SESSION_ID) {
    throw errors.invalid(`${header}: must be at most ${MAX_SESSION_ID} characters`, header);
  }
  return id;
}

/** Every check that needs no ledger or pool, so a bad request costs neither. */
async function inbound(
  c: Ctx,
  id: string,
  apiPath: ApiPath,
  schema: Schema,
  config: EdgeConfig,
  key: KeyRecord,
  access: AccessLog,
) {
  const { parsed, size } = await body(c, schema, config);
  // The model as asked for is worth logging even when a check below refuses it.
  access.set({ model: parsed.model, stream: parsed.stream === true && apiPath !== "/v1/embeddings" });
  const req: Inbound = {
    id,
    apiPath,
    key,
    body: parsed,
    generates: apiPath !== "/v1/embeddings",
    estimating: apiPath === "/v1/responses" ? chatViewOf(parsed) : parsed,
    size,
    chain: model(config.table, parsed.model, key),
    band: band(c, key, config),
    session: session(c, config),
    location: requestLocation(c.req.raw, c.env.LLMGW_LOCATION_HEADER),
  };
  return req;
}

/**
 * The key's own limits: the ledger holds a reservation until the charge
 * closes it. Resolves to the `x-ratelimit-*` headers of a key with RPM or TPM.
 */
function ledger(c: Ctx, config: EdgeConfig, req: Inbound): Promise<Record<string, string>> {
  return admitKey(
    c.env,
    req.key,
    reservationFor(req.id, req.estimating, req.size, req.generates, config.settings.timeouts.total),
  );
}

/** What the request asks of an engine, as admission and a charge without usage estimate it. */
function demandOf(config: EdgeConfig, req: Inbound): Demand {
  return predictDemand(req.estimating, req.generates, config.settings.scoring.assumed_output_tokens);
}

/** The model's pool (then its fallbacks') decides when and where: the plan holds the leases. */
function admission(c: Ctx, config: EdgeConfig, req: Inbound, demand: Demand): AttemptPlan {
  const first = req.chain[0]!;
  const prefix = req.generates ? requestPrefixHashes(first, req.estimating) : [];
  return new AttemptPlan(req.chain, async (m) => {
    const estimated = estimateTally.take(m);
    const lease = await admit({
      env: c.env,
      model: m,
      table: config.table,
      settings: config.settings,
      request: {
        id: req.id,
        band: req.band,
        key: req.key.id,
        policy: config.table.policy(m, config.settings.default_routing),
        session: req.session,
        prefix: m === first ? prefix : [],
        demand,
        estimated,
        location: req.location,
      },
      clientSignal: c.req.raw.signal,
      defer: (p) => c.executionCtx.waitUntil(p),
    });
    // A fail-open lease came from this isolate's own pool: the model's never heard.
    if (lease.failOpen) estimateTally.add(m, estimated);
    return lease;
  });
}

export function inference(apiPath: ApiPath, schema: Schema) {
  return async (c: Ctx) => {
    const requestId = newRequestId();
    // Workers' clock moves only across I/O, which is what these times are made of.
    const access = new AccessLog(requestId, apiPath, Date.now());
    try {
      // What the isolate has cached comes back without an await: under load
      // each resumption queues behind other streams' chunks.
      const cfg = edgeConfig(c.env, (p) => c.executionCtx.waitUntil(p));
      const config = cfg instanceof Promise ? await cfg : cfg;
      const k = caller(c);
      const key = k instanceof Promise ? await k : k;
      access.set({ key_id: key.id });
      const req = await inbound(c, requestId, apiPath, schema, config, key, access);
      const stream = access.entry.stream;
      access.set({ band: req.band });
      const rateHeaders = await ledger(c, config, req);
      const demand = demandOf(config, req);
      const plan = admission(c, config, req, demand);
      // Registered before the pool or an engine is asked: every request the
      // ledger admitted is charged once (failures for 0 tokens), every lease
      // released once and its access line written, even if the client
      // leaves — the runtime keeps this work alive (up to 30 s) after a
      // disconnect.
      let finish!: (o: Promise<Outcome | undefined>) => void;
      const finished = new Promise<Outcome | undefined>((r) => {
        finish = r;
      });
      c.executionCtx.waitUntil(
        finished
          .then((o) => {
            if (o) recordOutcome(access, o);
            access.end(Date.now());
            return Promise.all([plan.settle(), charge(c.env, key, requestId, o)]);
          })
          .catch((err) => console.error("charging or releasing failed", requestId, err)),
      );
      try {
        await plan.start();
      } catch (err) {
        if (err instanceof ClientGone) {
          access.set({ status: 499, error_code: "client_closed", client_disconnected: true });
          finish(Promise.resolve(undefined));
          return clientGone(requestId);
        }
        if (err instanceof ApiError) access.set({ status: err.status, error_code: err.code });
        finish(Promise.resolve(undefined));
        if (err instanceof ApiError) {
          return err.toResponse({
            "x-request-id": requestId,
            "x-llmgw-band": req.band,
            "x-llmgw-attempts": "0",
            ...rateHeaders,
          });
        }
        throw err;
      }
      const run = proxy({
        requestId,
        apiPath,
        body: req.body,
        promptTokens: demand.promptTokens,
        stream,
        settings: config.settings,
        band: req.band,
        targets: plan,
        clientSignal: c.req.raw.signal,
        upstream: (ep) => keyedUpstream(c.env, config.table, ep),
      });
      finish(
        run.then(
          (r) => {
            const responded = Date.now();
            const h = r.response.headers;
            access.set({ route: h.get("x-llmgw-route"), admitted: h.get("x-llmgw-admitted") });
            // A stream's 200 may go out before its first token (stream_commit: headers).
            return r.outcome.then((o) => {
              access.firstByte(o.firstByteAt ?? responded);
              return o;
            });
          },
          () => undefined,
        ),
      );
      const { response } = await run;
      for (const [k, v] of Object.entries(rateHeaders)) response.headers.set(k, v);
      return response;
    } catch (err) {
      access.set(
        err instanceof ApiError
          ? { status: err.status, error_code: err.code }
          : { status: 500, error_code: "internal_error" },
      );
      access.end(Date.now());
      if (err instanceof ApiError) return err.toResponse({ "x-request-id": requestId });
      return unhandledError(err, requestId);
    }
  };
}

function recordOutcome(access: AccessLog, o: Outcome): void {
  access.set({
    status: o.status,
    endpoint: o.endpointId ?? null,
    model_served: o.model ?? null,
    attempts: o.attempts,
    error_code: o.errorCode ?? null,
    completed: o.completed,
    client_disconnected: o.disconnected,
  });
  access.usage(o.usage, o.usageEstimated);
  if (o.usageEstimated && o.usage && o.model) {
    estimateTally.add(o.model, { requests: 1, tokens: o.usage.prompt_tokens + o.usage.completion_tokens });
  }
}

/** The client left while its request waited for admission: nobody reads this. */
function clientGone(requestId: string): Response {
  return new ApiError(
    499,
    "The client closed the request while it was queued.",
    "invalid_request_error",
    "client_closed",
  ).toResponse({
    "x-request-id": requestId,
  });
}
