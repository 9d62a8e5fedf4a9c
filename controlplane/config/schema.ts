import { z } from "zod";
import { modelNameSchema } from "../../common/catalog-names.ts";
import { durationSchema as duration, durationWithin } from "../../common/duration.ts";
import { viaSchema } from "../../common/endpoint-fields.ts";
import { LISTEN_ADDRESS } from "../../common/listen.ts";
import { staticEndpointSchema } from "../../common/static-endpoint.ts";
import { routerSchema, routingPolicy } from "../../edge/config/router.ts";
import { DEFAULT_SITE, siteNameSchema } from "../../edge/config/site-sets.ts";

/**
 * The configuration file's shape. Snake_case keys, as operators write YAML;
 * durations are strings such as `15s` and arrive here as milliseconds.
 * Every object is strict: a misspelt key is an error, not a silently ignored
 * setting.
 */
const listenAddress = z.string().regex(LISTEN_ADDRESS, "must be HOST:PORT or :PORT");

export const controlSchema = z.strictObject({
  interval: durationWithin("100ms", "1h").prefault("5s"),
  base_backoff: durationWithin("100ms", "24h").prefault("10s"),
  max_backoff: durationWithin("100ms", "24h").prefault("10m"),
  // Deliberately far apart: a network blip must not tear down replicas that
  // still serve, and rebuilding a multi-node replica costs many minutes.
  unreachable_after: durationWithin("500ms", "24h").prefault("15s"),
  lost_after: durationWithin("1s", "24h").prefault("60s"),
  // Nodes cannot become lost until this long after the control plane starts:
  // agents need time to reconnect after a control plane restart. Defaults to
  // lost_after.
  startup_grace: durationWithin("0s", "24h").optional(),
  // When more than this fraction of the fleet is unreachable at once, nodes
  // are not declared lost: the fault is more likely the control plane's own
  // network than half the fleet dying together.
  lost_freeze_fraction: z.number().min(0).max(1).default(0.5),
  heartbeat_interval: durationWithin("100ms", "1h").prefault("5s"),
  // Kept outside the kernel's ephemeral range (32768-60999 on Linux) so
  // engine ports never collide with outgoing connections.
  port_range: z
    .tuple([z.number().int().min(1).max(65535), z.number().int().min(1).max(65535)])
    .default([20000, 20999])
    .refine(([lo, hi]) => lo <= hi, "first port must not exceed the last"),
  mgmt_interface: z.string().min(1).default("eth0"),
  // Refuse stream messages larger than this: a broken agent must not be able
  // to make the control plane buffer without bound.
  max_message_bytes: z
    .number()
    .int()
    .positive()
    .default(4 * 1024 * 1024),
});

export const engineKind = z.enum(["vllm", "sglang", "sim"]);

// Scaling between replicas.min and replicas.max (docs/placement.md,
// "Scaling"). The top-level section is the default; a model's own `scaling`
// overrides any of its keys. The defaults follow the autoscalers that have
// run LLM fleets longest: a dead band of ±0.1 around the target and a scale
// down held back for minutes (AIBrix: 300 s), because a replica given back
// too early costs a model load to get again.
const scalingFields = {
  enabled: z.boolean().describe("Scale between replicas.min and replicas.max by demand; false keeps min"),
  target_saturation: z
    .number()
    .gt(0)
    .max(1)
    .describe("Saturation (demand over capacity, 0-1) each replica should sit at"),
  tolerance: z
    .number()
    .min(0)
    .max(0.5)
    .describe("Dead band around the target: up above target + tolerance, down only below target - tolerance"),
  window: durationWithin("2s", "1h").describe(
    "The demand signal is the mean over this window; no decision before half of it is seen",
  ),
  scale_up_cooldown: durationWithin("0s", "24h").describe(
    "Least time after any scale event before the next scale-up",
  ),
  scale_down_cooldown: durationWithin("0s", "24h").describe(
    "Least time after any scale event before a scale-down",
  ),
};

export const scalingSchema = z.strictObject({
  enabled: scalingFields.enabled.default(true),
  target_saturation: scalingFields.target_saturation.default(0.7),
  tolerance: scalingFields.tolerance.default(0.1),
  window: scalingFields.window.prefault("60s"),
  scale_up_cooldown: scalingFields.scale_up_cooldown.prefault("30s"),
  scale_down_cooldown: scalingFields.scale_down_cooldown.prefault("5m"),
});

export const modelScalingSchema = z.strictObject({
  enabled: scalingFields.enabled.optional(),
  target_saturation: scalingFields.target_saturation.optional(),
  tolerance: scalingFields.tolerance.optional(),
  window: scalingFields.window.optional(),
  scale_up_cooldown: scalingFields.scale_up_cooldown.optional(),
  scale_down_cooldown: scalingFields.scale_down_cooldown.optional(),
});

// The model/profile/endpoint part below is the catalog's input. Rules that
// span fields or models (parallelism arithmetic in controlplane/catalog.ts;
// name, alias and fallback rules in common/catalog-names.ts, which the edge
// applies too) live there, so there is one place each is enforced; this schema only types each field. The descriptions surface in
// `llmgw config schema` for editors.
export const profileSchema = z.strictObject({
  name: z
    .string()
    .min(1)
    .describe("Profile name, unique within the model; part of replica ids <model>/<profile>/<n>"),
  engine: engineKind.describe("Engine adapter: vllm, sglang, or sim (the CPU stand-in for vLLM)"),
  // What the engine loads: a Hugging Face id or a local path.
  source: z.string().min(1).describe("What the engine loads: a Hugging Face id or a local path"),
  tensor_parallel: z
    .number()
    .int()
    .min(1)
    .default(1)
    .describe("Tensor parallel size; must divide the GPUs per node"),
  pipeline_parallel: z
    .number()
    .int()
    .min(1)
    .default(1)
    .describe("Pipeline parallel size; stages may span nodes"),
  data_parallel: z.number().int().min(1).default(1).describe("Data parallel size inside one replica"),
  // Derived from the parallel sizes when omitted.
  gpus_per_node: z
    .number()
    .int()
    .min(1)
    .optional()
    .describe(
      "GPUs per node; defaults to tp × pp × dp / nodes and must satisfy gpus_per_node × nodes = tp × pp × dp",
    ),
  nodes: z.number().int().min(1).default(1).describe("Nodes per replica (one shard per node)"),
  gpu: z
    .strictObject({
      // Substring match against the GPU's reported name, e.g. "H100".
      model: z.string().optional().describe('Case-insensitive substring of the GPU name, e.g. "H100"'),
      min_memory_gib: z.number().positive().optional().describe("Minimum total VRAM per GPU, GiB"),
    })
    .default({}),
  // The fabric label key whose value must be shared by every node of a
  // multi-node replica (e.g. "ib" for one InfiniBand island).
  fabric: z
    .string()
    .optional()
    .describe(
      "Fabric label key all nodes of a multi-node replica must share a value of (required when nodes > 1)",
    ),
  engine_args: z.array(z.string()).default([]).describe("Extra engine arguments, appended as given"),
  env: z.record(z.string(), z.string()).default({}).describe("Extra environment for the engine process"),
  gpu_memory_utilization: z
    .number()
    .gt(0)
    .max(1)
    .default(0.9)
    .describe(
      "Fraction of each GPU's total VRAM the engine claims; that much must be free of other processes",
    ),
  replicas: z
    .strictObject({
      min: z.number().int().min(0).default(1).describe("Replicas kept running"),
      max: z.number().int().min(0).optional().describe("Upper bound for scaling; defaults to min"),
    })
    .default({ min: 1 }),
  startup_deadline: durationWithin("1s", "24h")
    .prefault("20m")
    .describe("Time a shard may take to become ready before it counts as failed"),
  stop_grace: durationWithin("0s", "1h")
    .prefault("30s")
    .describe("SIGTERM to SIGKILL grace when stopping a shard"),
  spread: z.boolean().default(false).describe("Place on the emptiest nodes instead of bin-packing"),
  // A changed profile replaces its running replicas make-before-break by
  // default: a GPU fleet that is full cannot surge, so max_unavailable is the
  // operator's explicit trade of capacity for progress.
  rollout: z
    .strictObject({
      max_surge: z
        .number()
        .int()
        .min(0)
        .default(1)
        .describe("Replicas placed beyond the wanted count while a changed profile rolls out"),
      max_unavailable: z
        .number()
        .int()
        .min(0)
        .default(0)
        .describe("Serving replicas a rollout may drain before their replacements are ready"),
      paused: z
        .boolean()
        .default(false)
        .describe(
          "Hold the rollout: replicas running an older spec keep running; new placements use the profile as it is",
        ),
    })
    .prefault({})
    .describe("How replicas running an older spec of this profile are replaced after it changes"),
});

export const modelSchema = z.strictObject({
  name: modelNameSchema.describe("The model name clients request"),
  aliases: z
    .array(z.string().min(1))
    .default([])
    .describe("Other names clients may use; unique across all models"),
  fallbacks: z
    .array(z.string().min(1))
    .default([])
    .describe("Models (names or aliases) tried in order when this one cannot serve; no cycles"),
  routing: routingPolicy
    .optional()
    .describe("Routing policy: chat, round-robin, least-load or random; defaults to router.default_routing"),
  priority: z
    .number()
    .int()
    .default(0)
    .describe(
      "Scaling priority: when GPUs are short, a model may take replicas above replicas.min from a model of lower priority",
    ),
  scaling: modelScalingSchema.optional().describe("This model's overrides of the top-level scaling section"),
  profiles: z
    .array(profileSchema)
    .default([])
    .describe("Deployment profiles placed by the control plane; none = router-only (static endpoints)"),
});

// mTLS on the agent listener (docs/agents.md, "Security: mTLS and
// enrollment"). Off by default until every agent has enrolled.
export const agentTlsSchema = z.strictObject({
  enabled: z.boolean().default(false).describe("Serve the agent listener over mTLS with enrollment"),
  // Unset means the machine's hostname, localhost and 127.0.0.1, filled in
  // by the control plane (controlplane/pki) where node:os is at hand.
  hostnames: z
    .array(z.string().min(1).max(253))
    .min(1)
    .optional()
    .describe(
      "Names and IPs agents dial; the server certificate's SANs (default: hostname, localhost, 127.0.0.1)",
    ),
  client_cert_validity: duration
    .prefault("365d")
    .refine((ms) => ms >= 3_600_000, "must be at least 1h")
    .describe("Validity of the client certificates enrolled agents get"),
  join_token_ttl: duration
    .prefault("1h")
    .refine((ms) => ms > 0, "must be positive")
    .describe("Default lifetime of a join token (ctl tokens create --ttl overrides it)"),
  enroll_per_minute: z
    .number()
    .int()
    .min(1)
    .max(10_000)
    .default(10)
    .describe("Enroll calls accepted per source address (IPv6: per /64) and minute, with a burst of as many"),
});

// An IPv4 or IPv6 network in CIDR notation. Checked here without node:net
// (this file is also bundled into the edge Worker).
const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const IPV6 = /^[0-9a-fA-F:]*:[0-9a-fA-F:]*$/;
export const cidr = z.string().refine((v) => {
  const m = /^([^/]+)\/(\d{1,3})$/.exec(v);
  if (!m) return false;
  const prefix = Number(m[2]);
  if (IPV4.test(m[1]!)) return prefix <= 32;
  return IPV6.test(m[1]!) && (m[1]!.match(/::/g) ?? []).length <= 1 && prefix <= 128;
}, "must be a network in CIDR notation, e.g. 10.0.0.0/8 or fd00::/8");

// Who may call ControlService on admin_listen (docs/security.md).
export const adminSchema = z.strictObject({
  token_env: z
    .string()
    .min(1)
    .default("LLMGW_ADMIN_TOKEN")
    .describe("Environment variable holding the admin bearer token (used when token_file is not set)"),
  token_file: z
    .string()
    .min(1)
    .optional()
    .describe(
      "File holding the admin bearer token, one per line (several during a rotation); re-read on SIGHUP",
    ),
  read_only_networks: z
    .array(cidr)
    .max(64)
    .default([])
    .describe(
      "Networks whose calls that read the fleet (nodes, replicas, models, explain, /metrics) need no token; never the calls that change something, key usage or the edge's view",
    ),
  allowed_hosts: z
    .array(
      z
        .string()
        .min(1)
        .max(253)
        .regex(/^[A-Za-z0-9.-]+$/, "a host name: letters, digits, . and - only"),
    )
    .max(64)
    .default([])
    .describe(
      "Names besides localhost, the machine's hostname and admin_listen's host that the admin listener answers to (the Host header); IP addresses always work",
    ),
});

// What one client may hold on either listener (docs/security.md): anyone
// who reaches a port can open connections, so their number and idle time
// are bounded.
export const listenersSchema = z.strictObject({
  max_connections: z
    .number()
    .int()
    .min(1)
    .max(1_000_000)
    .default(4096)
    .describe(
      "Connections each listener holds at once; more are refused (agent_listen: at least one per node)",
    ),
  max_connections_per_address: z
    .number()
    .int()
    .min(1)
    .max(1_000_000)
    .default(64)
    .describe("Connections each listener holds at once from one source address (IPv6: per /64)"),
  auth_timeout: durationWithin("1s", "60s")
    .prefault("5s")
    .describe(
      "A connection must finish its TLS handshake and open a stream (agent_listen without a client certificate) or send its request headers (admin_listen) within this",
    ),
  idle_timeout: durationWithin("1s", "1h")
    .prefault("60s")
    .describe("A connection with no stream or request in flight for this long is closed"),
});

export const configSchema = z.strictObject({
  // Separate from the agents' port so diagnostics and the operator API can be
  // firewalled apart from the fleet-facing surface.
  admin_listen: listenAddress.default(":9090"),
  agent_listen: listenAddress.default(":7443"),
  data_dir: z.string().default(".data"),
  // Several control planes behind one edge each publish their own site's
  // endpoint set and load (docs/sites.md); one alone keeps the default.
  site: siteNameSchema
    .default(DEFAULT_SITE)
    .describe(
      "This control plane's site: the edge keeps one endpoint set per site and routes over their union (read at start)",
    ),
  admin: adminSchema.prefault({}),
  agent_tls: agentTlsSchema.prefault({}),
  listeners: listenersSchema.prefault({}),
  edge: z
    .strictObject({
      url: z.string().optional(),
      // The bearer secret is read from this environment variable, never from
      // the file, so the file can be committed.
      token_env: z.string().default("LLMGW_EDGE_TOKEN"),
      // Engines the control plane places sit on the on-prem network; a
      // deployed edge reaches them through a Workers VPC binding or a tunnel.
      via: viaSchema
        .default("direct")
        .describe("How the edge reaches the engines this control plane places: direct, vpc or tunnel"),
      status_interval: durationWithin("1s", "60s")
        .prefault("5s")
        .describe(
          "How often the control plane asks the edge for its pools' status (ctl status, the dashboard, llmgw_edge_* metrics)",
        ),
    })
    .prefault({}),
  control: controlSchema.prefault({}),
  router: routerSchema.prefault({}),
  scaling: scalingSchema.prefault({}),
  models: z.array(modelSchema).default([]),
  endpoints: z.array(staticEndpointSchema).default([]),
});

export type Config = z.output<typeof configSchema>;
export type ControlConfig = Config["control"];
export type AgentTlsConfig = Config["agent_tls"];
export type ListenersConfig = Config["listeners"];
export type AdminConfig = Config["admin"];
export type ScalingConfig = Config["scaling"];
export type ModelConfig = z.output<typeof modelSchema>;
export type ProfileConfig = z.output<typeof profileSchema>;
export type { StaticEndpointConfig as EndpointConfig } from "../../common/static-endpoint.ts";
export type EngineKind = z.output<typeof engineKind>;
