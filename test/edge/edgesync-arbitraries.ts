/**
 * Arbitrary EdgeSync requests for the fuzz test (edgesync-fuzz.test.ts):
 * messages built from the proto's own descriptors (any value of each
 * field's type, biased toward values the edge gives meaning to), and
 * mutations of their JSON and binary encodings.
 */
import { type DescField, type DescMessage, ScalarType } from "@bufbuild/protobuf";
import fc from "fast-check";

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
export function messageArb(desc: DescMessage, depth = 0): fc.Arbitrary<Record<string, unknown>> {
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
export function mutateJson(value: unknown): fc.Arbitrary<unknown> {
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

export function mutateBytes(bytes: Uint8Array): fc.Arbitrary<Uint8Array> {
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
