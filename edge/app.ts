import { type Context, Hono } from "hono";
import type { z } from "zod";
import type { RouterConfig } from "../controlplane/config/schema.ts";
import { authenticate } from "./auth.ts";
import { Breakers } from "./breaker.ts";
import { type ChargeInput, sumCharges } from "./charge.ts";
import { ChargeBatcher } from "./charge-batcher.ts";
import { routingTable } from "./config-store.ts";
import { EDGESYNC_PREFIX, handleEdgeSync } from "./edgesync.ts";
import type { Env } from "./env.ts";
import { type KeyRecord, limitsOf, modelAllowed, resolveBand } from "./key-rules.ts";
import { ApiError, errors, refusal } from "./openai-errors.ts";
import { Picker } from "./picker.ts";
import { type ApiPath, type Outcome, proxy } from "./proxy.ts";
import {
  chatRequest,
  completionRequest,
  embeddingRequest,
  parseJsonBody,
  readBodyLimited,
  validate,
} from "./request-schema.ts";
import { reservationFor } from "./reservations.ts";
import { revocationLog, revocationWatch } from "./revocations.ts";
import { routerSettings } from "./settings.ts";
import { upstreamFor } from "./upstream.ts";

/**
 * The OpenAI surface. Order of checks, each with its own status: key (401)
 * → body size (413) → JSON and types (400) → model known (404) → model and
 * band allowed for the key (403) → the key's ledger: revoked (401), RPM/TPM
 * (429), budget (429 insufficient_quota), running requests that may spend
 * what is left (429, after a short wait) → engines (503/504, or theirs).
 * Nothing reaches an engine before all of these pass.
 */

// Isolate-wide, so what one request learns about a dead endpoint protects
// the next. Per isolate only: each isolate (and edge location) learns on
// its own until the ModelPool Durable Object holds shared breakers.
const breakers = new Breakers(3, 15_000);
const picker = new Picker();

type AppEnv = { Bindings: Env };

function settingsOf(env: Env): RouterConfig {
  const s = routerSettings(env.LLMGW_ROUTER);
  breakers.configure(s.failure_threshold, s.cooldown);
  return s;
}

function newRequestId(): string {
  return `req_${crypto.randomUUID().replaceAll("-", "")}`;
}

function ledgerOf(env: Env, keyId: string) {
  return env.KEY_LEDGER.get(env.KEY_LEDGER.idFromName(keyId));
}

interface PendingCharge {
  env: Env;
  charge: ChargeInput;
  periodMs: number;
}

async function flushCharges(keyId: string, items: PendingCharge[], batchId: string): Promise<void> {
  const first = items[0]!;
  await ledgerOf(first.env, keyId).charge(
    sumCharges(
      batchId,
      items.map((i) => i.charge),
    ),
    first.periodMs,
  );
}

// Keys with RPM, TPM or a budget are charged within milliseconds, so the
// next admission sees the tokens just used. Keys without limits only feed
// usage totals: their charges gather for a second, one ledger call per key
// per second per isolate instead of one per burst of requests.
const limitedCharges = new ChargeBatcher<PendingCharge>(flushCharges, 10);
const unlimitedCharges = new ChargeBatcher<PendingCharge>(flushCharges, 1_000);

/**
 * The key behind the Authorization header, refused if revoked. Revocation is
 * checked against the isolate's view of the RevocationLog, refreshed at most
 * every few seconds; if the log cannot be reached the view is kept (fail
 * open for that interval) rather than failing every request. Synchronous
 * when the key is cached and no refresh is due, as on most requests: under
 * load each await is a resumption queued behind other streams' chunks.
 */
function keyFor(c: Context<AppEnv>): KeyRecord | Promise<KeyRecord> {
  const key = authenticate(c.req.header("authorization") ?? null, c.env.LLMGW_KV);
  if (key instanceof Promise || revocationWatch.due()) return checkedAfterRefresh(c.env, key);
  return notRevoked(key);
}

async function checkedAfterRefresh(env: Env, pending: KeyRecord | Promise<KeyRecord>): Promise<KeyRecord> {
  const key = await pending;
  try {
    await revocationWatch.refresh((epoch) => revocationLog(env).since(epoch));
  } catch (err) {
    console.error("revocation log unreachable", err);
  }
  return notRevoked(key);
}

function notRevoked(key: KeyRecord): KeyRecord {
  if (revocationWatch.isRevoked(key.id)) throw errors.unauthorized("This API key has been revoked.");
  return key;
}

function hasLimits(key: KeyRecord): boolean {
  return key.rpm > 0 || key.tpm > 0 || (key.budget_tokens > 0 && key.budget_period_ms > 0);
}

export const app = new Hono<AppEnv>();

app.onError((err) => {
  if (err instanceof ApiError) return err.toResponse();
  console.error("unhandled error", err);
  return errors.internal(`Internal error: ${err instanceof Error ? err.message : String(err)}`).toResponse();
});

app.notFound(() =>
  errors
    .notFound(
      "Unknown path. This gateway serves /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models.",
    )
    .toResponse(),
);

app.get("/healthz", (c) => c.json({ status: "ok" }));

app.all(`${EDGESYNC_PREFIX}*`, (c) => handleEdgeSync(c.req.raw, c.env, settingsOf(c.env)));

app.get("/v1/models", async (c) => {
  const key = await keyFor(c);
  const table = await routingTable(c.env.LLMGW_KV);
  const data = table
    .modelNames()
    .filter((m) => modelAllowed(key, m, m))
    .map((id) => ({ id, object: "model", created: 0, owned_by: "llmgw" }));
  return c.json({ object: "list", data });
});

function inference(apiPath: ApiPath, schema: z.ZodType<Record<string, unknown> & { model: string }>) {
  return async (c: Context<AppEnv>) => {
    const requestId = newRequestId();
    try {
      const env = c.env;
      const settings = settingsOf(env);
      // Cached key and table come back synchronously; awaiting only a
      // promise spares the request two resumptions.
      const k = keyFor(c);
      const key = k instanceof Promise ? await k : k;
      const bytes = await readBodyLimited(c.req.raw, settings.max_body_bytes);
      const body = validate(schema, parseJsonBody(bytes));
      const t = routingTable(env.LLMGW_KV);
      const table = t instanceof Promise ? await t : t;
      const model = table.resolve(body.model);
      if (!model) throw errors.modelNotFound(body.model);
      if (!modelAllowed(key, model, body.model)) {
        throw errors.forbidden(
          `This key may not use the model \`${body.model}\`.`,
          "model_not_allowed",
          "model",
        );
      }
      const band = resolveBand(
        key,
        c.req.header(settings.admission.band_header) ?? null,
        settings.admission.bands,
        settings.admission.default_band,
      );
      // Keys without limits skip the ledger round trip at admission; their
      // usage is still charged (and revocation comes from the log above).
      const limited = hasLimits(key);
      const adm = limited
        ? await ledgerOf(env, key.id).admit(
            limitsOf(key),
            reservationFor(
              requestId,
              body,
              bytes.byteLength,
              apiPath !== "/v1/embeddings",
              settings.timeouts.total,
            ),
          )
        : { ok: true as const };
      if (!adm.ok) throw refusal(adm);
      const stream = body.stream === true && apiPath !== "/v1/embeddings";
      const run = proxy({
        requestId,
        apiPath,
        body,
        stream,
        chain: table.chain(model),
        table,
        settings,
        band: band.name,
        clientSignal: c.req.raw.signal,
        upstream: (ep) => upstreamFor(ep, env),
        breakers,
        picker,
      });
      // Registered before the first await on the engine: if the client
      // leaves, the runtime keeps this work alive (up to 30 s) so the
      // request is still charged, once, with what the engine produced.
      const charged = run
        .then((r) => r.outcome)
        .then((o: Outcome) =>
          (limited ? limitedCharges : unlimitedCharges).add(key.id, {
            env,
            periodMs: key.budget_period_ms,
            charge: {
              prompt_tokens: o.usage?.prompt_tokens ?? 0,
              completion_tokens: o.usage?.completion_tokens ?? 0,
              partial: !o.completed && o.status < 400,
              reservation: limited ? requestId : undefined,
            },
          }),
        )
        .catch((err) => console.error("charging failed", requestId, err));
      c.executionCtx.waitUntil(charged);
      return (await run).response;
    } catch (err) {
      if (err instanceof ApiError) return err.toResponse({ "x-request-id": requestId });
      throw err;
    }
  };
}

app.post("/v1/chat/completions", inference("/v1/chat/completions", chatRequest));
app.post("/v1/completions", inference("/v1/completions", completionRequest));
app.post("/v1/embeddings", inference("/v1/embeddings", embeddingRequest));
for (const path of ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]) {
  app.all(path, () => errors.methodNotAllowed(`${path} accepts POST only.`).toResponse({ allow: "POST" }));
}
app.all("/v1/models", () =>
  errors.methodNotAllowed("/v1/models accepts GET only.").toResponse({ allow: "GET" }),
);
