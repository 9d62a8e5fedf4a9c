import type { Context } from "hono";
import type { z } from "zod";
import { AttemptPlan } from "./attempt-plan.ts";
import { caller } from "./caller.ts";
import type { RoutingTable } from "./catalog.ts";
import { type EdgeConfig, edgeConfig } from "./config-store.ts";
import type { Env } from "./env.ts";
import { type KeyRecord, modelAllowed, resolveBand } from "./key-rules.ts";
import { admitKey, charge } from "./key-usage.ts";
import { ApiError, errors } from "./openai-errors.ts";
import { admit, ClientGone } from "./pool-client.ts";
import { type ApiPath, type Outcome, proxy } from "./proxy.ts";
import { parseJsonBody, readBodyLimited, validate } from "./request-schema.ts";
import { reservationFor } from "./reservations.ts";
import { requestPrefixHashes } from "./routing/prefix-hash.ts";
import { upstreamFor } from "./upstream.ts";

/**
 * One inference request, as the steps it goes through:
 *
 *   caller (401) → body (413, 415, 400) → model (404, 403) → band (400,
 *   403) → the key's ledger (401; 429 for RPM/TPM/budget, or for running
 *   requests that may spend what is left) → admission by the model's pool
 *   (429, 503; the queue) → proxy (retries, fallbacks; 503, 504, the
 *   engine's) → charge and release, after the response, in waitUntil.
 *
 * Nothing reaches an engine before every check before it has passed. Each
 * step is a function of its own below, in that order.
 */
type Ctx = Context<{ Bindings: Env }>;
type Schema = z.ZodType<Record<string, unknown> & { model: string }>;

const MAX_SESSION_ID = 256;

function newRequestId(): string {
  return `req_${crypto.randomUUID().replaceAll("-", "")}`;
}

async function body(c: Ctx, schema: Schema, config: EdgeConfig) {
  const bytes = await readBodyLimited(c.req.raw, config.settings.max_body_bytes);
  return { reqBody: validate(schema, parseJsonBody(bytes)), size: bytes.byteLength };
}

/** The canonical model and its fallbacks, if the key may use it. */
function model(table: RoutingTable, requested: string, key: KeyRecord): { model: string; chain: string[] } {
  const canonical = table.resolve(requested);
  if (!canonical) throw errors.modelNotFound(requested);
  if (!modelAllowed(key, canonical, requested)) {
    throw errors.forbidden(`This key may not use the model \`${requested}\`.`, "model_not_allowed", "model");
  }
  return { model: canonical, chain: table.chain(canonical) };
}

function band(c: Ctx, key: KeyRecord, config: EdgeConfig) {
  const a = config.settings.admission;
  return resolveBand(key, c.req.header(a.band_header) ?? null, a.bands, a.default_band);
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

/** The model's pool (then its fallbacks') decides when and where: the plan holds the leases. */
function admission(
  c: Ctx,
  config: EdgeConfig,
  requestId: string,
  key: KeyRecord,
  bandName: string,
  chain: string[],
  reqBody: Record<string, unknown>,
  apiPath: ApiPath,
): AttemptPlan {
  const sessionId = session(c, config);
  const prefix = apiPath === "/v1/embeddings" ? [] : requestPrefixHashes(chain[0]!, reqBody);
  return new AttemptPlan(chain, (m) =>
    admit({
      env: c.env,
      model: m,
      table: config.table,
      settings: config.settings,
      request: {
        id: requestId,
        band: bandName,
        key: key.id,
        policy: config.table.policy(m, config.settings.default_routing),
        session: sessionId,
        prefix: m === chain[0] ? prefix : [],
      },
      clientSignal: c.req.raw.signal,
      defer: (p) => c.executionCtx.waitUntil(p),
    }),
  );
}

export function inference(apiPath: ApiPath, schema: Schema) {
  return async (c: Ctx) => {
    const requestId = newRequestId();
    try {
      // What the isolate has cached comes back without an await: under load
      // each resumption queues behind other streams' chunks.
      const cfg = edgeConfig(c.env);
      const config = cfg instanceof Promise ? await cfg : cfg;
      const k = caller(c);
      const key = k instanceof Promise ? await k : k;
      const { reqBody, size } = await body(c, schema, config);
      const { chain } = model(config.table, reqBody.model, key);
      const b = band(c, key, config);
      const generates = apiPath !== "/v1/embeddings";
      await admitKey(
        c.env,
        key,
        reservationFor(requestId, reqBody, size, generates, config.settings.timeouts.total),
      );
      const plan = admission(c, config, requestId, key, b.name, chain, reqBody, apiPath);
      // Registered before the pool or an engine is asked: every request the
      // ledger admitted is charged once (failures for 0 tokens) and every
      // lease released once, even if the client leaves — the runtime keeps
      // this work alive (up to 30 s) after a disconnect.
      let finish!: (o: Promise<Outcome | undefined>) => void;
      const finished = new Promise<Outcome | undefined>((r) => {
        finish = r;
      });
      c.executionCtx.waitUntil(
        finished
          .then((o) => Promise.all([plan.settle(), charge(c.env, key, requestId, o)]))
          .catch((err) => console.error("charging or releasing failed", requestId, err)),
      );
      try {
        await plan.start();
      } catch (err) {
        finish(Promise.resolve(undefined));
        if (err instanceof ClientGone) return clientGone(requestId);
        if (err instanceof ApiError) {
          return err.toResponse({
            "x-request-id": requestId,
            "x-llmgw-band": b.name,
            "x-llmgw-attempts": "0",
          });
        }
        throw err;
      }
      const run = proxy({
        requestId,
        apiPath,
        body: reqBody,
        stream: reqBody.stream === true && apiPath !== "/v1/embeddings",
        settings: config.settings,
        band: b.name,
        targets: plan,
        clientSignal: c.req.raw.signal,
        upstream: (ep) => upstreamFor(ep, c.env),
      });
      finish(
        run.then(
          (r) => r.outcome,
          () => undefined,
        ),
      );
      return (await run).response;
    } catch (err) {
      if (err instanceof ApiError) return err.toResponse({ "x-request-id": requestId });
      throw err;
    }
  };
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
