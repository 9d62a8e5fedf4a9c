/**
 * JSON values for the sim's structured outputs: a value that conforms to a
 * JSON Schema (response_format `json_schema`, tool-call arguments), or an
 * object of about N tokens (`json_object`). Deterministic for a given
 * random source, so a seed gives the same answer every time.
 *
 * The supported subset, and the rule for the rest (docs/sim-engine.md):
 *
 * - honoured: `type` (a name or a list), `enum`, `const`, `properties`,
 *   `required`, `additionalProperties`, `items`, `prefixItems`,
 *   `additionalItems`, `minItems`, `maxItems`, `uniqueItems`, `minLength`,
 *   `maxLength`, `minimum`, `maximum`, `exclusiveMinimum`,
 *   `exclusiveMaximum`, `multipleOf`, `format` (the formats in FORMATS; others
 *   are annotations, as JSON Schema 2019+ treats them), `anyOf`/`oneOf` (one
 *   branch, seeded), `allOf` (merged), local `$ref` (`#`, `#/$defs/…`,
 *   `#/definitions/…`), `nullable`;
 * - refused (SchemaError, a 400): the assertions in UNSUPPORTED, which
 *   constrain values in ways a generator cannot honour in general (`pattern`
 *   first among them), and remote `$ref`s;
 * - ignored: every other keyword (`title`, `description`, `default`,
 *   `examples`, `$schema`, extensions...), as JSON Schema ignores unknown ones.
 *
 * Only declared properties are generated (plus required ones not declared),
 * so `additionalProperties: false` always holds. Optional properties are
 * included on a coin flip, and left out below MAX_OPTIONAL_DEPTH, where
 * arrays also take their minimum length: that ends recursive schemas.
 */
import { OUTPUT_VOCAB, tokenPieces } from "./text.ts";

export class SchemaError extends Error {
  /** JSON Pointer into the schema, "" for its root. */
  readonly at: string;
  constructor(at: string, message: string) {
    super(at === "" ? message : `${message} (at ${at})`);
    this.at = at;
  }
}

export const UNSUPPORTED: readonly string[] = [
  "pattern",
  "patternProperties",
  "propertyNames",
  "not",
  "if",
  "then",
  "else",
  "dependentRequired",
  "dependentSchemas",
  "dependencies",
  "minProperties",
  "maxProperties",
  "contains",
  "minContains",
  "maxContains",
  "unevaluatedItems",
  "$dynamicRef",
  "$recursiveRef",
  "contentSchema",
];

const TYPES = new Set(["object", "array", "string", "number", "integer", "boolean", "null"]);
const MAX_DEPTH = 16;
const MAX_OPTIONAL_DEPTH = 4;
/** Extra array items above minItems, at most. */
const ARRAY_SPREAD = 3;
/**
 * The most values (and string characters) one answer may take to build. A
 * schema's minimums are built whole before max_tokens cuts the text, so
 * without a bound one request's `minItems: 1e8` (or 100 four levels deep)
 * would hold the engine's one thread, and every stream on it, for good.
 */
const MAX_VALUES = 100_000;
const MAX_STRING = 100_000;

/** Words for generated strings and keys: the sim's output vocabulary without its spaces. */
const WORDS = OUTPUT_VOCAB.map((w) => w.trim()).filter((w) => /^[a-z]/i.test(w));

type Rand = () => number;
type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const pick = <T>(rand: Rand, list: readonly T[]): T => list[Math.floor(rand() * list.length)]!;
const escapePointer = (k: string) => k.replace(/~/g, "~0").replace(/\//g, "~1");

const FORMATS: Record<string, (rand: Rand) => string> = {
  "date-time": (r) =>
    `2025-0${1 + Math.floor(r() * 9)}-1${Math.floor(r() * 10)}T0${Math.floor(r() * 10)}:30:00Z`,
  date: (r) => `2025-0${1 + Math.floor(r() * 9)}-1${Math.floor(r() * 10)}`,
  time: (r) => `0${Math.floor(r() * 10)}:30:00Z`,
  email: (r) => `${pick(r, WORDS).toLowerCase()}@example.com`,
  uri: (r) => `https://example.com/${pick(r, WORDS).toLowerCase()}`,
  hostname: (r) => `${pick(r, WORDS).toLowerCase()}.example.com`,
  ipv4: (r) => `10.0.${Math.floor(r() * 256)}.${1 + Math.floor(r() * 254)}`,
  ipv6: (r) => `fd00::${(1 + Math.floor(r() * 0xfffe)).toString(16)}`,
  uuid: (r) => {
    const hex = Array.from({ length: 32 }, () => Math.floor(r() * 16).toString(16)).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-4${hex.slice(13, 16)}-a${hex.slice(17, 20)}-${hex.slice(20)}`;
  },
};

/** Walks every subschema reachable from `root` and refuses what the generator cannot honour. */
export function checkSchema(root: unknown): void {
  const seen = new Set<unknown>();
  const walk = (s: unknown, at: string): void => {
    if (typeof s === "boolean") return;
    if (!isObj(s)) throw new SchemaError(at, "a schema must be an object or a boolean");
    if (seen.has(s)) return;
    seen.add(s);
    for (const k of UNSUPPORTED) {
      if (k in s) throw new SchemaError(at, `keyword "${k}" is not supported by the sim engine`);
    }
    const types = s.type === undefined ? [] : Array.isArray(s.type) ? s.type : [s.type];
    for (const t of types) {
      if (typeof t !== "string" || !TYPES.has(t))
        throw new SchemaError(at, `unknown type ${JSON.stringify(t)}`);
    }
    if (s.enum !== undefined && (!Array.isArray(s.enum) || s.enum.length === 0)) {
      throw new SchemaError(at, "enum must be a non-empty array");
    }
    if (
      s.required !== undefined &&
      !(Array.isArray(s.required) && s.required.every((r) => typeof r === "string"))
    ) {
      throw new SchemaError(at, "required must be an array of strings");
    }
    for (const k of ["minItems", "maxItems", "minLength", "maxLength"]) {
      const v = s[k];
      if (v !== undefined && !(Number.isInteger(v) && (v as number) >= 0)) {
        throw new SchemaError(at, `${k} must be a non-negative integer`);
      }
    }
    if (typeof s.minItems === "number" && s.minItems > MAX_VALUES)
      throw new SchemaError(at, `minItems above ${MAX_VALUES} is more than the sim engine builds`);
    if (typeof s.minLength === "number" && s.minLength > MAX_STRING)
      throw new SchemaError(at, `minLength above ${MAX_STRING} is more than the sim engine builds`);
    for (const k of ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]) {
      if (s[k] !== undefined && typeof s[k] !== "number") throw new SchemaError(at, `${k} must be a number`);
    }
    if (typeof s.multipleOf === "number" && !(s.multipleOf > 0)) {
      throw new SchemaError(at, "multipleOf must be greater than 0");
    }
    if (s.$ref !== undefined) resolveRef(root, s.$ref, at);
    for (const key of ["properties", "$defs", "definitions"]) {
      const group = s[key];
      if (group === undefined) continue;
      if (!isObj(group)) throw new SchemaError(at, `${key} must be an object`);
      for (const [name, sub] of Object.entries(group)) walk(sub, `${at}/${key}/${escapePointer(name)}`);
    }
    for (const key of ["anyOf", "oneOf", "allOf", "prefixItems"]) {
      const list = s[key];
      if (list === undefined) continue;
      if (!Array.isArray(list) || list.length === 0)
        throw new SchemaError(at, `${key} must be a non-empty array`);
      for (const [i, sub] of list.entries()) walk(sub, `${at}/${key}/${i}`);
    }
    if (Array.isArray(s.items)) for (const [i, sub] of s.items.entries()) walk(sub, `${at}/items/${i}`);
    else if (s.items !== undefined) walk(s.items, `${at}/items`);
    for (const key of ["additionalProperties", "additionalItems", "unevaluatedProperties"]) {
      if (s[key] !== undefined) walk(s[key], `${at}/${key}`);
    }
  };
  walk(root, "");
}

function resolveRef(root: unknown, ref: unknown, at: string): unknown {
  if (typeof ref !== "string" || !ref.startsWith("#")) {
    throw new SchemaError(at, `only local $refs ("#/...") are supported, got ${JSON.stringify(ref)}`);
  }
  let node: unknown = root;
  for (const raw of ref.slice(1).split("/").slice(1)) {
    const key = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    if (!isObj(node) || !(key in node)) throw new SchemaError(at, `$ref ${ref} does not resolve`);
    node = node[key];
  }
  return node;
}

/** allOf and a branch of anyOf/oneOf over its parent: properties and required combined, the rest: later wins. */
function merge(a: Obj, b: Obj): Obj {
  const out: Obj = { ...a, ...b };
  if (isObj(a.properties) && isObj(b.properties)) out.properties = { ...a.properties, ...b.properties };
  if (Array.isArray(a.required) && Array.isArray(b.required)) {
    out.required = [...new Set([...a.required, ...b.required])];
  }
  return out;
}

/** A value conforming to `root` (checked with checkSchema first). */
export function sampleSchema(root: unknown, rand: Rand): unknown {
  return new SchemaSampler(root, rand).value(root, 0, "");
}

/** Draws values for one root schema: each keyword handled in the order the schema's meaning needs. */
class SchemaSampler {
  private built = 0;

  constructor(
    private readonly root: unknown,
    private readonly rand: Rand,
  ) {}

  value(schema: unknown, depth: number, at: string): unknown {
    if (depth > MAX_DEPTH) throw new SchemaError(at, `schema nests deeper than ${MAX_DEPTH} levels`);
    if (++this.built > MAX_VALUES)
      throw new SchemaError(at, `the least value the schema allows has more than ${MAX_VALUES} parts`);
    if (schema === false) throw new SchemaError(at, "schema false admits no value");
    const s = this.dereferenced(schema === true ? {} : (schema as Obj), at);
    if ("const" in s) return s.const;
    if (Array.isArray(s.enum)) return pick(this.rand, s.enum);
    if (Array.isArray(s.allOf)) {
      const { allOf, ...rest } = s;
      return this.value(
        (allOf as unknown[]).reduce<Obj>((acc, b) => merge(acc, b === true ? {} : (b as Obj)), rest),
        depth + 1,
        at,
      );
    }
    const branches = (s.anyOf ?? s.oneOf) as unknown[] | undefined;
    if (branches) {
      const { anyOf: _a, oneOf: _o, ...rest } = s;
      const i = Math.floor(this.rand() * branches.length);
      const branch = branches[i]!;
      if (branch === false)
        throw new SchemaError(`${at}/${s.anyOf ? "anyOf" : "oneOf"}/${i}`, "schema false admits no value");
      return this.value(merge(rest, branch === true ? {} : (branch as Obj)), depth + 1, at);
    }
    switch (typeOf(s, this.rand)) {
      case "object":
        return this.object(s, depth, at);
      case "array":
        return this.array(s, depth, at);
      case "integer":
        return sampleNumber(s, at, true, this.rand);
      case "number":
        return sampleNumber(s, at, false, this.rand);
      case "boolean":
        return this.rand() < 0.5;
      case "null":
        return null;
      default:
        return sampleString(s, this.rand);
    }
  }

  /** `s` with its $ref followed: siblings apply too (JSON Schema 2019+), and refs to refs are followed. */
  private dereferenced(schema: Obj, at: string): Obj {
    let s = schema;
    for (let hops = 0; s.$ref !== undefined; hops++) {
      if (hops > MAX_DEPTH) throw new SchemaError(at, "$ref cycle");
      const { $ref, ...rest } = s;
      const target = resolveRef(this.root, $ref, at);
      if (target === false) throw new SchemaError(at, "schema false admits no value");
      s = merge(target === true ? {} : (target as Obj), rest);
    }
    return s;
  }

  private object(s: Obj, depth: number, at: string): Obj {
    const props = isObj(s.properties) ? s.properties : {};
    const required = new Set((s.required as string[] | undefined) ?? []);
    const out: Obj = {};
    for (const [k, sub] of Object.entries(props)) {
      if (required.has(k) || (depth < MAX_OPTIONAL_DEPTH && this.rand() < 0.5)) {
        out[k] = this.value(sub, depth + 1, `${at}/properties/${escapePointer(k)}`);
      }
    }
    const extra = s.additionalProperties;
    for (const k of required) {
      if (k in out) continue;
      if (extra === false) {
        throw new SchemaError(
          at,
          `required property "${k}" is not in properties and additionalProperties is false`,
        );
      }
      out[k] = this.value(extra ?? {}, depth + 1, `${at}/additionalProperties`);
    }
    // A map: no named properties, only a schema for the values.
    if (
      Object.keys(props).length === 0 &&
      required.size === 0 &&
      isObj(extra) &&
      depth < MAX_OPTIONAL_DEPTH
    ) {
      const n = 1 + Math.floor(this.rand() * 2);
      for (let i = 0; i < n; i++)
        out[`${pick(this.rand, WORDS).toLowerCase()}_${i}`] = this.value(
          extra,
          depth + 1,
          `${at}/additionalProperties`,
        );
    }
    return out;
  }

  private array(s: Obj, depth: number, at: string): unknown[] {
    const prefix = (s.prefixItems ?? (Array.isArray(s.items) ? s.items : [])) as unknown[];
    const rest = Array.isArray(s.items) ? (s.additionalItems ?? true) : (s.items ?? true);
    const lo = (s.minItems as number | undefined) ?? 0;
    let hi = Math.min((s.maxItems as number | undefined) ?? lo + ARRAY_SPREAD, lo + ARRAY_SPREAD);
    if (rest === false) hi = Math.min(hi, prefix.length);
    if (hi < lo)
      throw new SchemaError(at, "no array length satisfies minItems, maxItems and the item schemas");
    const len = depth < MAX_OPTIONAL_DEPTH ? lo + Math.floor(this.rand() * (hi - lo + 1)) : lo;
    const out: unknown[] = [];
    const seen = new Set<string>();
    for (let i = 0; out.length < len; i++) {
      const sub = out.length < prefix.length ? prefix[out.length] : rest;
      const where = out.length < prefix.length ? `${at}/prefixItems/${out.length}` : `${at}/items`;
      const v = this.value(sub, depth + 1, where);
      if (s.uniqueItems === true) {
        const key = JSON.stringify(v);
        if (seen.has(key)) {
          if (i > 8 * (len + 1)) {
            if (out.length >= lo) break;
            throw new SchemaError(at, `cannot find ${lo} distinct items for uniqueItems`);
          }
          continue;
        }
        seen.add(key);
      }
      out.push(v);
    }
    return out;
  }
}

/** A number within the schema's bounds, a multiple of its multipleOf. */
function sampleNumber(s: Obj, at: string, integer: boolean, rand: Rand): number {
  const num = (k: string) => (typeof s[k] === "number" ? (s[k] as number) : undefined);
  const exMin = num("exclusiveMinimum");
  const exMax = num("exclusiveMaximum");
  const multipleOf = num("multipleOf");
  if (integer && multipleOf !== undefined && !Number.isInteger(multipleOf)) {
    throw new SchemaError(at, "multipleOf of an integer must be an integer");
  }
  // Work in multiples of a unit, so bounds, integrality and multipleOf hold together.
  const unit = multipleOf ?? (integer ? 1 : 0.01);
  let lo = num("minimum") ?? exMin;
  let hi = num("maximum") ?? exMax;
  if (lo === undefined) lo = hi === undefined ? 0 : hi - 100;
  if (hi === undefined) hi = lo + 100;
  let kLo = Math.ceil(lo / unit - 1e-9);
  let kHi = Math.floor(hi / unit + 1e-9);
  if (exMin !== undefined && kLo * unit <= exMin) kLo++;
  if (exMax !== undefined && kHi * unit >= exMax) kHi--;
  if (kHi < kLo) throw new SchemaError(at, "no number satisfies the bounds");
  const k = kLo + Math.floor(rand() * (kHi - kLo + 1));
  return Number((k * unit).toPrecision(12));
}

/** Words (or a value of the schema's format), stretched and cut to its length bounds. */
function sampleString(s: Obj, rand: Rand): string {
  const format = typeof s.format === "string" ? FORMATS[s.format] : undefined;
  let text = format ? format(rand) : "";
  if (!format) {
    const n = 1 + Math.floor(rand() * 4);
    text = Array.from({ length: n }, () => pick(rand, WORDS)).join(" ");
  }
  const min = (s.minLength as number | undefined) ?? 0;
  const max = s.maxLength as number | undefined;
  let length = [...text].length;
  while (length < min) {
    const word = ` ${pick(rand, WORDS)}`;
    text += word;
    length += [...word].length;
  }
  if (max !== undefined) text = [...text].slice(0, Math.max(max, min)).join("");
  return text;
}

/** The schema's type: declared (one of a list, seeded; null only when alone), else inferred from its keywords. */
function typeOf(s: Obj, rand: Rand): string {
  if (typeof s.type === "string") return s.type;
  if (Array.isArray(s.type) && s.type.length > 0) {
    const concrete = (s.type as string[]).filter((t) => t !== "null");
    return concrete.length > 0 ? pick(rand, concrete) : "null";
  }
  if ("properties" in s || "required" in s || "additionalProperties" in s) return "object";
  if ("items" in s || "prefixItems" in s || "minItems" in s || "maxItems" in s) return "array";
  if ("minimum" in s || "maximum" in s || "exclusiveMinimum" in s || "exclusiveMaximum" in s) return "number";
  if ("multipleOf" in s) return "number";
  return "string";
}

/**
 * `response_format: {"type": "json_object"}`: a flat object of string
 * values, entries added until its text is at least `targetTokens` tokens.
 */
export function sampleJsonObject(rand: Rand, targetTokens: number): Obj {
  const out: Obj = {};
  // `{` and `}`; each entry adds its own pieces and a comma (punctuation is always its own token).
  let tokens = 2;
  for (let i = 0; tokens < targetTokens; i++) {
    let key = pick(rand, WORDS).toLowerCase();
    if (key in out) key = `${key}_${i}`;
    const words = 2 + Math.floor(rand() * 6);
    const text = Array.from({ length: words }, () => pick(rand, WORDS)).join(" ");
    out[key] = text;
    tokens += tokenPieces(JSON.stringify({ [key]: text })).length - 2 + (i > 0 ? 1 : 0);
  }
  return out;
}
