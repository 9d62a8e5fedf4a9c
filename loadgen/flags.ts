/**
 * `llmgw bench` flags: node's parseArgs for the shape, zod for the values,
 * errors named by flag (`--rate: ...`). The API key is read from the
 * environment only, never a flag, so it stays out of shell history and `ps`.
 */
import { parseArgs } from "node:util";
import { z } from "zod";
import { parseDuration } from "../common/duration.ts";
import {
  type BandWeights,
  DEFAULT_BANDS,
  RANDOM_DEFAULTS,
  type RandomOptions,
  SHARED_PREFIX_DEFAULTS,
  type SharedPrefixOptions,
} from "./workloads.ts";

export const BENCH_HELP = `usage: llmgw bench --url URL (--rate R,R,... | --concurrency C,C,...) [flags]

A load generator for any OpenAI-compatible URL (the edge or an engine): streamed chat completions,
one table row per load level. See docs/bench.md.

target
  --url URL             base URL of the edge or an engine (http://host:port; a trailing /v1 is fine)
  --model NAME          model to ask for (default: the first one GET /v1/models lists)
  --header K:V          extra request header, repeatable (e.g. x-llmgw-band:silver)
  --timeout DUR         abandon a request after this long, real time (default 5m)
  --time-scale K        the target runs K× faster than real time (a sim engine's --sim-speed K):
                        schedules, durations and every reported time and rate are in its time (default 1)
  API key: $LLMGW_API_KEY, else $OPENAI_API_KEY (not a flag, so it stays out of ps and shell history)

load (one of --rate or --concurrency)
  --rate LIST           open loop: Poisson arrivals at each rate in turn, req/s (e.g. 1,2,4)
  --concurrency LIST    closed loop: that many streams, each sending its next request when one ends
  --duration DUR        length of each level (default 30s)
  --requests N          requests per level, instead of --duration
  --warmup N            requests sent at the first level's load before measuring (default 0)
  --seed N              workload seed: same seed, same prompts and arrival times (default 1)

workload
  --workload NAME       shared-prefix (default), random or band-mix
  shared-prefix         --groups ${SHARED_PREFIX_DEFAULTS.groups} --users-per-group ${SHARED_PREFIX_DEFAULTS.usersPerGroup} --system-tokens ${SHARED_PREFIX_DEFAULTS.systemTokens} --question-tokens ${SHARED_PREFIX_DEFAULTS.questionTokens} --turns ${SHARED_PREFIX_DEFAULTS.turns}
  random                --prompt-tokens ${RANDOM_DEFAULTS.promptTokens} --prompt-spread ${RANDOM_DEFAULTS.spread}
  band-mix              --bands ${Object.entries(DEFAULT_BANDS)
    .map(([b, w]) => `${b}=${w}`)
    .join(",")} --band-base random|shared-prefix
                        (default random), and the base workload's flags
  any                   --output-tokens ${SHARED_PREFIX_DEFAULTS.outputTokens} (max_tokens) --ignore-eos (generate exactly that many)

output
  --json                the results as JSON instead of a table
  --plot FILE.svg       write TTFT p90 and output throughput against load (band-mix: per band too)
`;

export type WorkloadSpec =
  | { kind: "shared-prefix"; options: SharedPrefixOptions }
  | { kind: "random"; options: RandomOptions }
  | { kind: "band-mix"; base: "shared-prefix"; bands: BandWeights; options: SharedPrefixOptions }
  | { kind: "band-mix"; base: "random"; bands: BandWeights; options: RandomOptions };

export interface BenchFlags {
  url: string;
  model?: string;
  apiKey?: string;
  headers: Record<string, string>;
  timeoutMs: number;
  timeScale: number;
  load: { kind: "rate" | "concurrency"; values: number[] };
  /** Per level: a duration in target seconds, or a request count. */
  level: { seconds: number } | { requests: number };
  warmup: number;
  seed: number;
  workload: WorkloadSpec;
  json: boolean;
  plot?: string;
}

export class FlagError extends Error {}

const positiveInt = z.coerce.number().int().min(1);

/** `1,2,4`: every item a number the item schema accepts. */
const list = (item: z.ZodType<number, number>) =>
  z
    .string()
    .transform((s) => s.split(",").map((x) => (x.trim() === "" ? Number.NaN : Number(x))))
    .pipe(z.array(item).min(1));

const duration = z.string().transform((s, ctx) => {
  try {
    const ms = parseDuration(s);
    if (ms <= 0) ctx.addIssue({ code: "custom", message: "must be longer than 0" });
    return ms;
  } catch (err) {
    ctx.addIssue({ code: "custom", message: (err as Error).message });
    return z.NEVER;
  }
});

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

const Schema = z.object({
  url: z
    .string()
    .regex(/^https?:\/\/[^/]+/, "expected an http:// or https:// URL")
    .transform((u) => u.replace(/\/+$/, "").replace(/\/v1$/, "")),
  model: z.string().min(1).optional(),
  header: z
    .array(
      z
        .string()
        .regex(/^[^:]+:/, "expected NAME:VALUE")
        .transform((h) => {
          const i = h.indexOf(":");
          return [h.slice(0, i).trim().toLowerCase(), h.slice(i + 1).trim()] as const;
        })
        .refine(([name]) => HEADER_NAME.test(name), "not a valid header name")
        .refine(
          ([name]) => name !== "authorization",
          "the API key comes from $LLMGW_API_KEY or $OPENAI_API_KEY, not a flag",
        ),
    )
    .default([]),
  timeout: duration.default(300_000),
  "time-scale": z.coerce.number().positive().max(1e6).default(1),
  rate: list(z.number().positive().max(1e6)).optional(),
  concurrency: list(z.number().int().min(1).max(100_000)).optional(),
  duration: duration.optional(),
  requests: positiveInt.optional(),
  warmup: z.coerce.number().int().min(0).default(0),
  seed: z.coerce.number().int().default(1),
  workload: z.enum(["shared-prefix", "random", "band-mix"]).default("shared-prefix"),
  groups: positiveInt.max(10_000).optional(),
  "users-per-group": positiveInt.max(100_000).optional(),
  "system-tokens": z.coerce.number().int().min(0).max(10_000_000).optional(),
  "question-tokens": positiveInt.max(10_000_000).optional(),
  turns: positiveInt.max(1000).optional(),
  "prompt-tokens": positiveInt.max(10_000_000).optional(),
  "prompt-spread": z.coerce.number().min(0).max(1).optional(),
  "output-tokens": positiveInt.max(10_000_000).optional(),
  "ignore-eos": z.boolean().default(false),
  bands: z
    .string()
    .transform((s, ctx) => {
      const bands: BandWeights = {};
      for (const part of s.split(",")) {
        const [name = "", weight = "", ...rest] = part.trim().split("=");
        const w = Number(weight);
        if (!/^[a-z0-9_-]+$/.test(name) || weight === "" || !(w >= 0) || rest.length > 0) {
          ctx.addIssue({
            code: "custom",
            message: `"${part}" is not BAND=WEIGHT (a lower-case name, a weight ≥ 0)`,
          });
          return z.NEVER;
        }
        bands[name] = w;
      }
      if (!Object.values(bands).some((w) => w > 0)) {
        ctx.addIssue({ code: "custom", message: "at least one band needs a positive weight" });
        return z.NEVER;
      }
      return bands;
    })
    .optional(),
  "band-base": z.enum(["random", "shared-prefix"]).optional(),
  json: z.boolean().default(false),
  plot: z.string().min(1).optional(),
});

type Raw = z.infer<typeof Schema>;

/** parseArgs' view of the same flags: every one takes a string but these. */
const BOOLEANS = new Set(["ignore-eos", "json"]);
const OPTIONS = {
  ...Object.fromEntries(
    Object.keys(Schema.shape).map((name) => [
      name,
      name === "header"
        ? { type: "string" as const, multiple: true }
        : { type: BOOLEANS.has(name) ? ("boolean" as const) : ("string" as const) },
    ]),
  ),
  help: { type: "boolean" as const, short: "h" },
};

const SHARED_PREFIX_FLAGS = [
  "groups",
  "users-per-group",
  "system-tokens",
  "question-tokens",
  "turns",
] as const;
const RANDOM_FLAGS = ["prompt-tokens", "prompt-spread"] as const;
const BAND_FLAGS = ["bands", "band-base"] as const;

/** A flag that changes nothing is refused, not ignored: the run would not be what was asked for. */
function refuse(raw: Raw, flags: readonly (keyof Raw)[], why: string): void {
  for (const f of flags) if (raw[f] !== undefined) throw new FlagError(`--${String(f)}: ${why}`);
}

function sharedPrefixOptions(r: Raw): SharedPrefixOptions {
  const d = SHARED_PREFIX_DEFAULTS;
  return {
    groups: r.groups ?? d.groups,
    usersPerGroup: r["users-per-group"] ?? d.usersPerGroup,
    systemTokens: r["system-tokens"] ?? d.systemTokens,
    questionTokens: r["question-tokens"] ?? d.questionTokens,
    outputTokens: r["output-tokens"] ?? d.outputTokens,
    turns: r.turns ?? d.turns,
    ignoreEos: r["ignore-eos"],
  };
}

function randomOptions(r: Raw): RandomOptions {
  const d = RANDOM_DEFAULTS;
  return {
    promptTokens: r["prompt-tokens"] ?? d.promptTokens,
    spread: r["prompt-spread"] ?? d.spread,
    outputTokens: r["output-tokens"] ?? d.outputTokens,
    ignoreEos: r["ignore-eos"],
  };
}

function workloadSpec(r: Raw): WorkloadSpec {
  if (r.workload !== "band-mix") refuse(r, BAND_FLAGS, "applies to --workload band-mix");
  const base = r.workload === "band-mix" ? (r["band-base"] ?? "random") : r.workload;
  if (base === "shared-prefix")
    refuse(r, RANDOM_FLAGS, "applies to the random workload (or band-mix with --band-base random)");
  else
    refuse(
      r,
      SHARED_PREFIX_FLAGS,
      "applies to the shared-prefix workload (or band-mix with --band-base shared-prefix)",
    );
  if (r.workload === "shared-prefix") return { kind: "shared-prefix", options: sharedPrefixOptions(r) };
  if (r.workload === "random") return { kind: "random", options: randomOptions(r) };
  const bands = r.bands ?? DEFAULT_BANDS;
  return base === "shared-prefix"
    ? { kind: "band-mix", base, bands, options: sharedPrefixOptions(r) }
    : { kind: "band-mix", base: "random", bands, options: randomOptions(r) };
}

export function parseBenchFlags(argv: string[], env: NodeJS.ProcessEnv): BenchFlags | "help" {
  let values: Record<string, unknown>;
  try {
    ({ values } = parseArgs({ args: argv, strict: true, allowPositionals: false, options: OPTIONS }));
  } catch (err) {
    throw new FlagError((err as Error).message);
  }
  if (values.help) return "help";
  if (values.url === undefined) throw new FlagError("--url is required (the edge's or an engine's base URL)");
  const parsed = Schema.safeParse(values);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const flag = issue.path.length > 0 ? `--${String(issue.path[0])}` : "flags";
    throw new FlagError(`${flag}: ${issue.message}`);
  }
  const r = parsed.data;
  if (r.rate !== undefined && r.concurrency !== undefined)
    throw new FlagError(
      "--rate and --concurrency: one or the other, not both (an open-loop sweep of arrival rates, or a closed-loop one of streams)",
    );
  if (r.rate === undefined && r.concurrency === undefined)
    throw new FlagError("give one of --rate (e.g. 1,2,4 req/s) or --concurrency (e.g. 1,8,32)");
  if (r.duration !== undefined && r.requests !== undefined)
    throw new FlagError("give --duration or --requests, not both");
  const apiKey = env.LLMGW_API_KEY || env.OPENAI_API_KEY;
  return {
    url: r.url,
    ...(r.model !== undefined ? { model: r.model } : {}),
    ...(apiKey ? { apiKey } : {}),
    headers: Object.fromEntries(r.header),
    timeoutMs: r.timeout,
    timeScale: r["time-scale"],
    load:
      r.rate !== undefined
        ? { kind: "rate", values: r.rate }
        : { kind: "concurrency", values: r.concurrency! },
    level: r.requests !== undefined ? { requests: r.requests } : { seconds: (r.duration ?? 30_000) / 1000 },
    warmup: r.warmup,
    seed: r.seed,
    workload: workloadSpec(r),
    json: r.json,
    ...(r.plot !== undefined ? { plot: r.plot } : {}),
  };
}
