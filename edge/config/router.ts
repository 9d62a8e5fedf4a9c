/**
 * The router's settings: what the edge applies when it admits, routes and
 * proxies requests. The edge owns this schema. The control plane's config
 * file embeds it as its `router:` section and pushes that section through
 * EdgeSync (PutRouterSettings), where it is validated again, versioned and
 * stored in KV; `LLMGW_ROUTER` overrides it locally. Snake_case keys and
 * duration strings, as operators write YAML; every object is strict.
 */
import { z } from "zod";
import { durationWithin } from "../../common/duration.ts";
import { routerSitesSchema } from "./router-sites.ts";

/** The routing policies a model may name. `chat` is the product; the others are baselines. */
export const ROUTING_POLICIES = ["chat", "round-robin", "least-load", "random"] as const;
export type RoutingPolicy = (typeof ROUTING_POLICIES)[number];
export const routingPolicy = z.enum(ROUTING_POLICIES);

const timeoutsSchema = z.strictObject({
  // Workers' fetch does not expose connection setup, so connecting cannot be
  // bounded apart from the header wait (docs/edge.md, "Timeouts"): a file
  // that sets it is told so, rather than loading with a key that does nothing.
  dial: z
    .never({
      error:
        "not supported: Workers' fetch cannot bound connecting apart from waiting for headers (a refused connection fails at once; response_header and first_token bound the rest); remove it",
    })
    .optional(),
  response_header: durationWithin("10ms", "24h").prefault("60s"),
  first_token: durationWithin("10ms", "24h").prefault("120s"),
  idle: durationWithin("10ms", "24h").prefault("60s"),
  total: durationWithin("100ms", "24h").prefault("30m"),
});

const scoringSchema = z.strictObject({
  target_waiting: z.number().positive().default(4),
  // The share of an engine's batch (its `max_num_seqs`) at which it counts
  // as saturated. Half, because that is where the reference engine (an 8B
  // model on an H100, batch 256) has slowed its step to about 2.5× an idle
  // one's: saturated for latency, though not yet for memory. Lower band
  // ceilings are fractions of it, so it sets how much room platinum keeps.
  // bench:routing's simulation: platinum's TTFT p99 under a band-mix
  // overload stays within 1.4× of unloaded at half the batch, 2.4× at all
  // of it (docs/routing.md).
  seq_ceiling: z.number().gt(0).max(1).default(0.5),
  // Sequences in flight below which no engine counts as saturated by its
  // batch, whatever seq_ceiling makes of it (capped at the batch itself).
  // Half of a small batch is a waste: a step of 16 sequences is still
  // mostly the read of the weights (the reference engine's step is under a
  // fifth slower than one sequence's), so on a 4-slot engine half the batch
  // kept the top band waiting for answers to end on an idle fleet.
  // bench:routing's burst (docs/routing.md). 0 leaves seq_ceiling alone.
  seq_floor: z.number().int().min(0).default(16),
  // An override: requests in flight per unit of `weight` at which every
  // endpoint counts as saturated, whatever its capacity. Unset, the target
  // follows each engine's own batch (seq_ceiling × max_num_seqs, at least
  // seq_floor).
  target_inflight: z.number().positive().optional(),
  kv_ceiling: z.number().gt(0).max(1).default(0.9),
  // Prompts admitted to an endpoint and not yet at their first token (a
  // stream each, a short one as a fraction: pool-core.ts prefillWeightOf),
  // per unit of weight, at which it counts as saturated: the engine's
  // queue as the pool sees it at every decision, where the scraped
  // `waiting` comes seconds late and a large batch shows none (it runs
  // every prefill at once, oldest first). A platinum prompt waits behind
  // what its engine still has to prefill; at 2, bronze's ceiling (0.30)
  // leaves it about half a prompt ahead. bench:routing's burst
  // (docs/routing.md).
  target_prefilling: z.number().positive().default(2),
  // What a request that names no max_tokens is charged for its answer at
  // admission: the engine itself would allow up to the context length,
  // which charged in full would hold every band far below what runs.
  assumed_output_tokens: z.number().int().positive().default(512),
  session_load_factor: z.number().min(1).default(1.25),
  // Sized like the engines' prefix cache, in 64-character blocks: an index
  // larger than the cache believes in blocks the engine has long evicted.
  prefix_cache_blocks: z.number().int().min(0).default(31_250),
});

const bandSchema = z.strictObject({
  name: z.string().regex(/^[a-z][a-z0-9_-]*$/, "must be lower-case letters, digits, - or _"),
  priority: z.number().int(),
  saturation_ceiling: z.number().gt(0).max(1),
});

export const DEFAULT_BANDS = [
  { name: "platinum", priority: 400, saturation_ceiling: 1.0 },
  { name: "gold", priority: 300, saturation_ceiling: 0.85 },
  { name: "silver", priority: 200, saturation_ceiling: 0.6 },
  { name: "bronze", priority: 100, saturation_ceiling: 0.3 },
];

const admissionSchema = z
  .strictObject({
    enabled: z.boolean().default(true),
    bands: z.array(bandSchema).min(1).default(DEFAULT_BANDS),
    default_band: z.string().default("gold"),
    band_header: z.string().default("x-llmgw-band"),
    queue_ttl: durationWithin("0s", "1h").prefault("30s"),
    queue_capacity_per_band: z.number().int().positive().default(2000),
    // Slots a pool sets aside, while it is far below every ceiling, for an
    // isolate's next request like one it just admitted, so that request
    // starts without a round trip to the pool; off, every request asks
    // (docs/routing.md, "Grants").
    grants: z.boolean().default(true),
  })
  .superRefine((a, ctx) => {
    const names = new Set<string>();
    const priorities = new Set<number>();
    a.bands.forEach((b, i) => {
      if (names.has(b.name))
        ctx.addIssue({ code: "custom", path: ["bands", i, "name"], message: "duplicate band" });
      if (priorities.has(b.priority)) {
        ctx.addIssue({
          code: "custom",
          path: ["bands", i, "priority"],
          message: "two bands share this priority",
        });
      }
      names.add(b.name);
      priorities.add(b.priority);
    });
    if (!names.has(a.default_band)) {
      ctx.addIssue({
        code: "custom",
        path: ["default_band"],
        message: `must be one of the bands (${[...names].join(", ")})`,
      });
    }
  });

/** `*`, or an origin as a browser sends it: scheme, host and port, no path or trailing slash. */
function isOrigin(s: string): boolean {
  if (s === "*") return true;
  try {
    const u = new URL(s);
    return (u.protocol === "https:" || u.protocol === "http:") && u.origin === s;
  } catch {
    return false;
  }
}

const corsSchema = z.strictObject({
  // Any origin by default, as OpenAI and vLLM answer: keys are bearer
  // tokens, never cookies, so a page from an allowed origin can use only a
  // key it already holds. [] turns cross-origin access off.
  allowed_origins: z
    .array(
      z.string().refine(isOrigin, {
        error:
          'must be "*" or an origin as a browser sends it, e.g. https://chat.example.com (no path, no trailing slash)',
      }),
    )
    .default(["*"]),
});

export const routerSchema = z.strictObject({
  scrape_interval: durationWithin("100ms", "1h").prefault("2s"),
  scrape_timeout: durationWithin("100ms", "1m").prefault("1s"),
  stale_after: durationWithin("100ms", "24h").prefault("10s"),
  retries: z.number().int().min(0).max(10).default(2),
  cooldown: durationWithin("0s", "24h").prefault("15s"),
  failure_threshold: z.number().int().min(1).default(3),
  default_routing: routingPolicy.default("chat"),
  session_header: z.string().default("x-session-id"),
  inject_usage: z.boolean().default(true),
  // When a stream's response (its 200) goes to the client. Either way a
  // failure before the first token is retried on another endpoint; what
  // differs is the last one's: an error event in the stream already begun,
  // or a status of its own, for which the client's time to its first token
  // carries the response's start (docs/edge.md, "When a stream is committed").
  stream_commit: z.enum(["headers", "first_token"]).default("headers"),
  max_body_bytes: z
    .number()
    .int()
    .positive()
    .default(32 * 1024 * 1024),
  // Beyond the queue TTL, how long a Worker waits for the model's pool
  // before routing on its own: a pool that answers neither with a lease
  // nor with a refusal by then is taken for unreachable.
  pool_timeout: durationWithin("10ms", "1m").prefault("2s"),
  timeouts: timeoutsSchema.prefault({}),
  scoring: scoringSchema.prefault({}),
  admission: admissionSchema.prefault({}),
  sites: routerSitesSchema.prefault({}),
  cors: corsSchema.prefault({}),
});

export type RouterConfig = z.output<typeof routerSchema>;

export type ScoringConfig = RouterConfig["scoring"];
export type AdmissionConfig = RouterConfig["admission"];
export type BandConfig = AdmissionConfig["bands"][number];
