/**
 * Property-based fuzzing of EdgeSync in workerd (the bundled Worker under
 * Miniflare): every method, with requests built from the proto's own
 * descriptors (any value of each field's type, biased toward values the
 * edge gives meaning to), their JSON and binary encodings mutated, raw
 * garbage, unknown methods and content types, and wrong tokens. For every
 * request: the Worker answers (no hang, no 5xx, no dropped connection),
 * with either success or a Connect error whose code is the caller's
 * (invalid_argument, not_found, …) and a message; and a victim key and a
 * victim model that no request names are exactly as they were.
 */
import { create, fromBinary, fromJsonString, toBinary, toJson } from "@bufbuild/protobuf";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashSecret } from "../../cli/ctl/keys.ts";
import { DEFAULT_SITE } from "../../edge/config/site-sets.ts";
import {
  EdgeSyncService,
  EndpointSchema,
  PutEndpointSetsRequestSchema,
} from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { messageArb, mutateBytes, mutateJson } from "./edgesync-arbitraries.ts";
import {
  clientFor,
  createKey,
  type FastEdge,
  type Sim,
  setEndpoints,
  startEdgeMiniflare,
  startSim,
  stopStarted,
  type TestKey,
} from "./helpers.ts";

const RUNS = Number(process.env.LLMGW_FUZZ_RUNS ?? 300);

const VICTIM_MODEL = "victim-model";
const VICTIM_ENDPOINT = "victim-1";
const CLIENT_CODES = new Set([
  "invalid_argument",
  "failed_precondition",
  "out_of_range",
  "not_found",
  "already_exists",
  "unimplemented",
  "resource_exhausted",
  "unauthenticated",
]);

const methods = EdgeSyncService.methods;

interface Call {
  method: string;
  contentType: string;
  body: Uint8Array | string;
  auth: "right" | string | null;
  httpMethod: string;
}

describe("EdgeSync under fuzzing, in workerd", () => {
  let edge: FastEdge;
  let sim: Sim;
  let victim: TestKey;

  beforeAll(async () => {
    [edge, sim] = await Promise.all([startEdgeMiniflare(), startSim(VICTIM_MODEL)]);
    await setEndpoints(edge, [{ id: VICTIM_ENDPOINT, url: sim.url, models: [VICTIM_MODEL] }]);
    victim = await createKey(edge, { band: "gold", rpm: 1000 });
  }, 90_000);

  afterAll(stopStarted);

  /** Everything the fuzzed calls must leave alone: the victim key and the victim model's pool. */
  async function victimState() {
    const [{ keys }, { usage }, { pools }] = await Promise.all([
      edge.sync.listKeys({}),
      edge.sync.getUsage({ keyId: victim.id }),
      edge.sync.getPoolStatus({ model: VICTIM_MODEL }),
    ]);
    const key = keys.find((k) => k.id === victim.id);
    const pool = pools[0];
    return JSON.stringify({
      key: key && [key.hash, key.maxBand, key.defaultBand, key.models, key.rpm, key.tpm, key.revoked],
      usage: usage.map((u) => [String(u.requests), String(u.totalTokens), u.revoked]),
      endpoints: pool?.endpoints.map((e) => [e.id, e.url, e.pool, e.priority, e.weight, e.state, e.breaker]),
      error: pool?.error,
    });
  }

  /** A request for one method: generated from its descriptor, then encoded, perhaps mutated. */
  const callArb: fc.Arbitrary<Call> = fc
    .tuple(
      fc.oneof(
        { weight: 12, arbitrary: fc.constantFrom(...methods) },
        { weight: 1, arbitrary: fc.constant(undefined) },
      ),
      fc.oneof(
        { weight: 8, arbitrary: fc.constant<"right">("right") },
        { weight: 1, arbitrary: fc.constant(null) },
        { weight: 1, arbitrary: fc.string({ maxLength: 30 }) },
        { weight: 1, arbitrary: fc.string({ maxLength: 30 }).map((s) => `Bearer ${s}`) },
      ),
      fc.oneof(
        { weight: 20, arbitrary: fc.constant("POST") },
        { weight: 1, arbitrary: fc.constantFrom("GET", "PUT", "DELETE") },
      ),
    )
    .chain(([m, auth, httpMethod]) => {
      const desc = m?.input;
      const name = m ? m.name : "NoSuchMethod";
      const built = desc
        ? messageArb(desc).map((init) => protect(m.name, create(desc, init as never)))
        : fc.constant(undefined);
      const encoded = built.chain((msg) => {
        const json = desc && msg ? toJson(desc, msg) : {};
        const bin = desc && msg ? toBinary(desc, msg) : new Uint8Array();
        return fc.oneof(
          {
            weight: 4,
            arbitrary: fc.constant({ contentType: "application/json", body: JSON.stringify(json) }),
          },
          { weight: 3, arbitrary: fc.constant({ contentType: "application/proto", body: bin }) },
          {
            weight: 3,
            arbitrary: mutateJson(json).map((v) => ({
              contentType: "application/json",
              body: v === undefined ? "" : JSON.stringify(v),
            })),
          },
          {
            weight: 2,
            arbitrary: mutateBytes(bin).map((body) => ({ contentType: "application/proto", body })),
          },
          {
            weight: 1,
            arbitrary: fc.record({
              contentType: fc.constantFrom(
                "application/json",
                "application/proto",
                "text/plain",
                "",
                "application/grpc",
              ),
              body: fc.oneof(fc.string({ maxLength: 200 }), fc.uint8Array({ maxLength: 200 })),
            }),
          },
        );
      });
      return encoded.map(
        (e): Call => ({ method: name, contentType: e.contentType, body: e.body, auth, httpMethod }),
      );
    });

  const isDefaultSite = (site: unknown) => site === undefined || site === "" || site === DEFAULT_SITE;

  /**
   * What a generated request may not do, as no request meant for its own
   * objects would: name the victim's endpoint or model, revoke the victim
   * key. A PutKey that reuses the victim's id stays: it must be refused.
   * Every endpoint set keeps the victim's endpoint as it is.
   */
  function protect<T extends object>(method: string, msg: T): T {
    const m = msg as Record<string, unknown>;
    if (method === "RevokeKey" && m.id === victim.id) m.id = "fz-key";
    if (method === "PushLoad") {
      m.loads = (m.loads as { endpointId: string }[]).filter((l) => l.endpointId !== VICTIM_ENDPOINT);
    }
    if (method === "PutKey" && (m.key as { id?: string } | undefined)?.id === victim.id) {
      (m.key as { hash: string }).hash = hashSecret("not the victim's secret");
    }
    if (method === "PutEndpointSets") {
      const others = (m.endpoints as { id: string; models: string[] }[]).filter(
        (e) => e.id !== VICTIM_ENDPOINT && !e.models.includes(VICTIM_MODEL),
      );
      // The victim's endpoint lives in the default site's set; another site's set must not serve its model.
      if (!isDefaultSite(m.site)) {
        m.endpoints = others;
        return msg;
      }
      m.endpoints = [
        ...others,
        create(EndpointSchema, {
          id: VICTIM_ENDPOINT,
          url: sim.url,
          models: [VICTIM_MODEL],
          pool: "default",
          weight: 1,
          priority: 0,
          via: "direct",
        }),
      ];
    }
    return msg;
  }

  /**
   * A mutated body that still parses is a whole new endpoint set, and a cut
   * at a message boundary can drop the victim's endpoint from it: the edge
   * did as told. The victim is put back, as it was, before the check.
   */
  async function keepVictimEndpoint(call: Call): Promise<void> {
    const bytes = typeof call.body === "string" ? new TextEncoder().encode(call.body) : call.body;
    const sent = call.contentType?.includes("json")
      ? fromJsonString(PutEndpointSetsRequestSchema, new TextDecoder().decode(bytes), {
          ignoreUnknownFields: true,
        })
      : fromBinary(PutEndpointSetsRequestSchema, bytes);
    if (!isDefaultSite(sent.site)) return;
    const kept = sent.endpoints.find((e) => e.id === VICTIM_ENDPOINT);
    if (
      kept &&
      kept.url === sim.url &&
      kept.models.join() === VICTIM_MODEL &&
      kept.weight === 1 &&
      kept.priority === 0 &&
      kept.pool === "default"
    )
      return;
    // Without what would clash with the victim's pool and priority (one priority per pool).
    const endpoints = sent.endpoints.filter((e) => e.pool !== "default" || e.priority === 0);
    await edge.sync.putEndpointSets(
      protect("PutEndpointSets", { ...sent, endpoints, version: 0n, allowEmpty: false }),
    );
  }

  it(`answers every request with success or the caller's error, and touches nothing it does not name (${RUNS} runs)`, async () => {
    const before = await victimState();
    const seen = new Map<string, number>();
    // The edge keeps state from call to call, so a failure may be set up by an earlier call:
    // no shrinking (it would replay against a changed edge), and the calls before it are shown.
    const history: string[] = [];
    await fc
      .assert(
        fc.asyncProperty(callArb, async (call) => {
          history.push(
            `${call.httpMethod} ${call.method} ${call.contentType} ${typeof call.body === "string" ? call.body.slice(0, 300) : `[${call.body.length} bytes]`}`,
          );
          const headers: Record<string, string> = {};
          if (call.contentType) headers["content-type"] = call.contentType;
          if (call.auth === "right") headers.authorization = `Bearer ${edge.token}`;
          else if (call.auth !== null) headers.authorization = call.auth;
          const res = await fetch(`${edge.url}/${EdgeSyncService.typeName}/${call.method}`, {
            method: call.httpMethod,
            headers,
            body: call.httpMethod === "GET" ? undefined : (call.body as BodyInit),
            signal: AbortSignal.timeout(15_000),
          });
          const bytes = new Uint8Array(await res.arrayBuffer());
          const outcome = res.status === 200 ? "ok" : `${res.status}`;
          expect(res.status, new TextDecoder().decode(bytes)).toBeLessThan(500);
          if (call.auth !== "right") expect(res.status).toBe(401);
          if (res.status !== 200) {
            const err = JSON.parse(new TextDecoder().decode(bytes)) as { code?: string; message?: string };
            expect(CLIENT_CODES, JSON.stringify(err)).toContain(err.code);
            expect(typeof err.message === "string" && err.message.length > 0, JSON.stringify(err)).toBe(true);
            seen.set(`${call.method} ${err.code}`, (seen.get(`${call.method} ${err.code}`) ?? 0) + 1);
          } else seen.set(`${call.method} ${outcome}`, (seen.get(`${call.method} ${outcome}`) ?? 0) + 1);
          if (call.method === "PutEndpointSets" && res.status === 200) await keepVictimEndpoint(call);
          expect(await victimState()).toBe(before);
        }),
        {
          numRuns: RUNS,
          // A failure prints its seed; LLMGW_FUZZ_SEED replays it against a fresh edge.
          ...(process.env.LLMGW_FUZZ_SEED ? { seed: Number(process.env.LLMGW_FUZZ_SEED) } : {}),
          endOnFailure: true,
          interruptAfterTimeLimit: 240_000,
          markInterruptAsFailure: true,
        },
      )
      .catch((err) => {
        throw new Error(
          `${String(err)}\ncaused by: ${String((err as Error).cause)}\nthe calls before it, last first:\n${history.slice(-8).reverse().join("\n")}`,
        );
      });
    console.log(
      `EdgeSync fuzz: ${RUNS} runs; answers by method and code:\n${[...seen]
        .sort()
        .map(([k, n]) => `  ${k}: ${n}`)
        .join("\n")}`,
    );
    // Still serving, and the victim key still works on the victim model (under the default
    // router settings again: a fuzzed PutRouterSettings may have been valid, and taken).
    await edge.sync.putRouterSettings({ settingsJson: "{}" });
    const r = await clientFor(edge, victim.secret).chat.completions.create({
      model: VICTIM_MODEL,
      messages: [{ role: "user", content: "still there?" }],
      max_tokens: 2,
    });
    expect(r.usage?.completion_tokens).toBe(2);
  }, 300_000);
});
