import {
  create,
  type DescField,
  type DescMessage,
  fromBinary,
  fromJsonString,
  ScalarType,
  toBinary,
  toJson,
} from "@bufbuild/protobuf";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashSecret } from "../../cli/ctl/keys.ts";
import {
  EdgeSyncService,
  EndpointSchema,
  PutEndpointSetsRequestSchema,
} from "../../proto/gen/edge/v1/edgesync_pb.ts";
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

// Words the edge gives meaning to, so generated requests get past the first
// check often enough to reach the later ones; mixed with arbitrary text.
const WORDS = [
  "",
  " ",
  "gold",
  "platinum",
  "silver",
  "bronze",
  "chat",
  "round-robin",
  "least-load",
  "random",
  "1d",
  "30d",
  "0s",
  "-1d",
  "10s",
  "direct",
  "vpc",
  "tunnel",
  "ready",
  "draining",
  "down",
  "default",
  "fz-model",
  "fz-alias",
  "fz-1",
  "fz-2",
  "fz-key",
  "http://127.0.0.1:9",
  "https://engine.example/v1",
  "ftp://x",
  "keyids/x",
  "../../keys",
  "a".repeat(600),
  "\u0000",
  "é🙂",
  // Names an object lookup finds on Object.prototype.
  "constructor",
  "__proto__",
  "toString",
];
const hex64 = fc.stringMatching(/^[0-9a-f]{64}$/);
const routerJson = fc
  .record(
    {
      retries: fc.oneof(fc.integer({ min: -2, max: 10 }), fc.string()),
      max_body_bytes: fc.oneof(fc.integer(), fc.constant(1e308)),
      failure_threshold: fc.integer({ min: -1, max: 10 }),
      cooldown: fc.constantFrom("1s", "0s", "-1s", "forever", "100ms"),
      timeouts: fc.record(
        { first_token: fc.constantFrom("1s", "0s", "x", "2h"), idle: fc.constantFrom("1s", "nope") },
        { requiredKeys: [] },
      ),
      admission: fc.record(
        {
          queue_ttl: fc.constantFrom("5s", "0s", "-5s"),
          default_band: fc.constantFrom("gold", "nope"),
          bands: fc.array(
            fc.record({
              name: fc.constantFrom("gold", "x", ""),
              priority: fc.integer(),
              ceiling: fc.double(),
            }),
            { maxLength: 3 },
          ),
        },
        { requiredKeys: [] },
      ),
      colour: fc.string(),
    },
    { requiredKeys: [] },
  )
  .map((o) => JSON.stringify(o));

const text = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom(...WORDS) },
  { weight: 1, arbitrary: fc.string({ maxLength: 40 }) },
  { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) },
);

const ids = fc.oneof(fc.constantFrom("fz-key", "fz-1", "fz-2"), fc.stringMatching(/^[A-Za-z0-9_-]{1,64}$/));
const models = fc.constantFrom("fz-model", "fz-alias", "fz-other", "constructor", "__proto__");
/** What each string field holds when it is right, by field name; anything else for the rest. */
const PLAUSIBLE: Record<string, fc.Arbitrary<string>> = {
  id: ids,
  keyId: ids,
  endpointId: ids,
  hash: hex64,
  url: fc.constantFrom("http://127.0.0.1:9", "https://engine.example/v1", "http://[::1]:8000"),
  maxBand: fc.constantFrom("platinum", "gold", "silver", "bronze"),
  defaultBand: fc.constantFrom("", "gold", "bronze"),
  routing: fc.constantFrom("", "chat", "round-robin", "least-load", "random"),
  via: fc.constantFrom("", "direct", "vpc", "tunnel"),
  state: fc.constantFrom("ready", "draining", "down"),
  period: fc.constantFrom("1d", "30d", "1h"),
  pool: fc.constantFrom("default", "spill"),
  settingsJson: fc.oneof(routerJson, fc.constantFrom("{}", "[]", "null", "{")),
  name: models,
  model: models,
  models,
  aliases: models,
  fallbacks: models,
};

function stringFor(name: string): fc.Arbitrary<string> {
  const plausible = PLAUSIBLE[name];
  return plausible ? fc.oneof({ weight: 3, arbitrary: plausible }, { weight: 1, arbitrary: text }) : text;
}

function scalarArb(t: ScalarType, name: string): fc.Arbitrary<unknown> {
  switch (t) {
    case ScalarType.STRING:
      return stringFor(name);
    case ScalarType.BOOL:
      return fc.boolean();
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return fc.oneof(fc.double(), fc.constantFrom(0, 0.5, 1, 2, -1, 1e308));
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return fc.oneof(fc.integer({ min: -5, max: 10 }), fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }));
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return fc.oneof(fc.nat(100), fc.integer({ min: 0, max: 2 ** 32 - 1 }));
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return fc.oneof(fc.bigInt({ min: 0n, max: 10n }), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }));
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
      return fc.oneof(
        fc.bigInt({ min: -1n, max: 10n }),
        fc.constant(BigInt(Date.now())),
        fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }),
      );
    case ScalarType.BYTES:
      return fc.uint8Array({ maxLength: 16 });
  }
}

/** Any value of a message's type, every field optional, lists short (now and then long). */
function messageArb(desc: DescMessage, depth = 0): fc.Arbitrary<Record<string, unknown>> {
  const fields: Record<string, fc.Arbitrary<unknown>> = {};
  for (const f of desc.fields) fields[f.localName] = fieldArb(f, depth);
  return fc.record(fields, { requiredKeys: [] });
}

function fieldArb(f: DescField, depth: number): fc.Arbitrary<unknown> {
  switch (f.fieldKind) {
    case "scalar":
      return scalarArb(f.scalar, f.localName);
    case "enum":
      return fc.integer({ min: -1, max: 5 });
    case "message":
      return depth > 3 ? fc.constant(undefined) : messageArb(f.message, depth + 1);
    case "list": {
      const item =
        f.listKind === "scalar"
          ? scalarArb(f.scalar, f.localName)
          : f.listKind === "enum"
            ? fc.integer({ min: -1, max: 5 })
            : messageArb(f.message, depth + 1);
      return fc.oneof(
        { weight: 9, arbitrary: fc.array(item, { maxLength: 4 }) },
        fc.array(item, { maxLength: 300 }),
      );
    }
    case "map":
      return fc.dictionary(
        fc.string({ maxLength: 8 }),
        f.mapKind === "message" ? messageArb(f.message, depth + 1) : fc.constant(undefined),
      );
  }
}

/** A JSON value with one part replaced by anything, removed, or an unknown field added. */
function mutateJson(value: unknown): fc.Arbitrary<unknown> {
  const paths: (string | number)[][] = [];
  const walk = (v: unknown, path: (string | number)[]) => {
    paths.push(path);
    if (Array.isArray(v)) for (const [i, x] of v.entries()) walk(x, [...path, i]);
    else if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) walk(x, [...path, k]);
  };
  walk(value, []);
  return fc
    .tuple(
      fc.constantFrom(...paths),
      fc.oneof(
        fc.jsonValue({ maxDepth: 3 }),
        fc.constantFrom(null, -1, 1e308, "NaN", "Infinity", "18446744073709551616", "", [], {}),
      ),
      fc.constantFrom("replace", "delete", "add"),
    )
    .map(([path, replacement, how]) => {
      const copy = structuredClone(value);
      if (path.length === 0) return how === "delete" ? undefined : replacement;
      let at = copy as Record<string | number, unknown>;
      for (const p of path.slice(0, -1)) at = at[p] as Record<string | number, unknown>;
      const last = path.at(-1)!;
      if (how === "delete") delete at[last];
      else if (how === "add" && at && typeof at === "object" && !Array.isArray(at))
        at.fuzzUnknown = replacement;
      else at[last] = replacement;
      return copy;
    });
}

function mutateBytes(bytes: Uint8Array): fc.Arbitrary<Uint8Array> {
  return fc.oneof(
    fc
      .array(fc.tuple(fc.nat(Math.max(0, bytes.length - 1)), fc.integer({ min: 0, max: 255 })), {
        minLength: 1,
        maxLength: 4,
      })
      .map((flips) => {
        const out = bytes.slice();
        for (const [i, b] of flips) if (i < out.length) out[i] = b;
        return out;
      }),
    fc.nat(bytes.length).map((n) => bytes.slice(0, n)),
    fc.uint8Array({ minLength: 1, maxLength: 32 }).map((tail) => new Uint8Array([...bytes, ...tail])),
  );
}

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
      m.endpoints = [
        ...(m.endpoints as { id: string; models: string[] }[]).filter(
          (e) => e.id !== VICTIM_ENDPOINT && !e.models.includes(VICTIM_MODEL),
        ),
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
