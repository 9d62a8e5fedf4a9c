/**
 * `llmgw sim-engine serve MODEL [vLLM flags] [--sim-* flags]`.
 *
 * The command line is `vllm serve`'s, so the vLLM adapter's real argument
 * construction can be pointed at the sim engine unchanged: `--flag value`
 * and `--flag=value`, underscores or dashes (`--max_num_seqs`), vLLM's short
 * forms `-tp/-pp/-dp`, `--no-<bool>`. Flags vLLM has but the sim does not
 * model are accepted with a warning, never refused: a fleet must not fail to
 * start because an operator tuned something the simulator ignores.
 */
import { z } from "zod";
import { QUIRKS, type Quirk } from "./quirks.ts";

export type Kind = "string" | "int" | "number" | "bool" | "list";

/** The `--sim-*` flags, shared by every persona (vLLM's here, SGLang's in sglang-flags.ts). */
export const SIM_KINDS: Record<string, Kind> = {
  "sim-speed": "number",
  "sim-kv-blocks": "int",
  "sim-gpu-memory-gib": "number",
  "sim-startup-seconds": "number",
  "sim-fail-rate": "number",
  "sim-crash-after": "int",
  "sim-hang-after": "int",
  "sim-hang-phase": "string",
  "sim-slow-token-ms": "number",
  "sim-output-len": "int",
  "sim-weights-read-ms": "number",
  "sim-prefill-us-per-token": "number",
  "sim-per-seq-us": "number",
  "sim-trace": "string",
  "sim-quirks": "list",
};

const KNOWN: Record<string, Kind> = {
  model: "string",
  host: "string",
  port: "int",
  "served-model-name": "list",
  "tensor-parallel-size": "int",
  "pipeline-parallel-size": "int",
  "data-parallel-size": "int",
  nnodes: "int",
  "node-rank": "int",
  "master-addr": "string",
  "master-port": "int",
  headless: "bool",
  "gpu-memory-utilization": "number",
  "max-model-len": "string",
  "max-num-seqs": "int",
  "max-num-batched-tokens": "int",
  "enable-prefix-caching": "bool",
  "block-size": "int",
  seed: "int",
  "enable-prompt-tokens-details": "bool",
  "enable-auto-tool-choice": "bool",
  "tool-call-parser": "string",
  "api-key": "list",
  ...SIM_KINDS,
};

const SHORT: Record<string, string> = {
  tp: "tensor-parallel-size",
  pp: "pipeline-parallel-size",
  dp: "data-parallel-size",
};

const int = (min: number) => z.coerce.number().int().min(min);
const count = z.coerce.number().int().min(0);

/** `--max-model-len` takes 4096, 32k, 1M like vLLM (k = 1000, K = 1024). */
const modelLen = z
  .string()
  .regex(/^\d+(\.\d+)?[kKmM]?$/, "expected a token count such as 4096, 32k or 1M")
  .transform((s) => {
    const unit = s.at(-1)!;
    const mult = { k: 1e3, K: 1024, m: 1e6, M: 1024 * 1024 }[unit] ?? 1;
    return Math.round(Number.parseFloat(s) * mult);
  })
  .pipe(z.number().int().min(1));

/** The `--sim-*` flags' schema, shared by every persona. */
export const SIM_SHAPE = {
  "sim-speed": z.coerce.number().gt(0).max(1e6).default(1),
  "sim-kv-blocks": int(1).optional(),
  "sim-gpu-memory-gib": z.coerce.number().gt(0).default(80),
  "sim-startup-seconds": z.coerce.number().min(0).default(0),
  "sim-fail-rate": z.coerce.number().min(0).max(1).default(0),
  "sim-crash-after": count.optional(),
  "sim-hang-after": count.optional(),
  "sim-hang-phase": z.enum(["first-token", "mid-stream"]).default("first-token"),
  "sim-slow-token-ms": z.coerce.number().min(0).default(0),
  "sim-output-len": int(1).default(128),
  "sim-weights-read-ms": z.coerce.number().min(0).optional(),
  "sim-prefill-us-per-token": z.coerce.number().min(0).optional(),
  "sim-per-seq-us": z.coerce.number().min(0).optional(),
  "sim-trace": z.string().min(1).optional(),
  // Space- or comma-separated: `--sim-quirks no-done usage-on-finish` or `--sim-quirks=no-done,usage-on-finish`.
  "sim-quirks": z.preprocess(
    (v) => (Array.isArray(v) ? v.flatMap((s) => String(s).split(",")).filter(Boolean) : v),
    z.array(z.enum(QUIRKS)).default([]),
  ),
};

const SIM_SCHEMA = z.object(SIM_SHAPE);

const Schema = z.object({
  model: z.string().min(1),
  host: z.string().min(1).default("0.0.0.0"),
  port: int(0).max(65535).default(8000),
  "served-model-name": z.array(z.string().min(1)).min(1).optional(),
  "tensor-parallel-size": int(1).default(1),
  "pipeline-parallel-size": int(1).default(1),
  "data-parallel-size": int(1).default(1),
  nnodes: int(1).default(1),
  "node-rank": int(0).default(0),
  "master-addr": z.string().optional(),
  "master-port": int(1).max(65535).optional(),
  headless: z.boolean().default(false),
  "gpu-memory-utilization": z.coerce.number().gt(0).max(1).default(0.9),
  "max-model-len": modelLen.optional(),
  "max-num-seqs": int(1).default(256),
  "max-num-batched-tokens": int(1).default(8192),
  "enable-prefix-caching": z.boolean().default(true),
  "block-size": int(1).max(1024).default(16),
  seed: z.coerce.number().int().default(0),
  "enable-prompt-tokens-details": z.boolean().default(false),
  "enable-auto-tool-choice": z.boolean().default(false),
  "tool-call-parser": z.string().min(1).optional(),
  // Empty keys are allowed, as vLLM's argparse allows them; they are dropped (apiKeysOf).
  "api-key": z.array(z.string()).min(1).optional(),
  ...SIM_SHAPE,
});

export type RawFlags = z.infer<typeof Schema>;

export interface SimEngineFlags {
  model: string;
  host: string;
  port: number;
  servedModelNames: string[];
  tensorParallelSize: number;
  pipelineParallelSize: number;
  dataParallelSize: number;
  nnodes: number;
  nodeRank: number;
  masterAddr?: string;
  masterPort?: number;
  headless: boolean;
  gpuMemoryUtilization: number;
  maxModelLen?: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  enablePrefixCaching: boolean;
  blockSize: number;
  seed: number;
  enablePromptTokensDetails: boolean;
  /** `--enable-auto-tool-choice`; the parser's name is required with it, as in vLLM, and changes nothing in the sim. */
  enableAutoToolChoice: boolean;
  toolCallParser?: string;
  /**
   * `--api-key KEY...`, else `VLLM_API_KEY`: the keys a `/v1` request must
   * bear (api-key.ts); none, the API is open. Never logged.
   */
  apiKeys: string[];
  sim: {
    speed: number;
    kvBlocks?: number;
    gpuMemoryGiB: number;
    startupSeconds: number;
    failRate: number;
    crashAfter?: number;
    hangAfter?: number;
    hangPhase: "first-token" | "mid-stream";
    slowTokenMs: number;
    outputLen: number;
    weightsReadMs?: number;
    prefillUsPerToken?: number;
    perSeqUs?: number;
    /** `--sim-trace`: append a JSON line per generation request to this file (request-trace.ts). */
    trace?: string;
    /** `--sim-quirks`: how this engine differs from vLLM (quirks.ts). */
    quirks: Set<Quirk>;
  };
  /** `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`: how long an idle connection is kept before the engine closes it. */
  httpKeepAliveSeconds: number;
  /** Flags accepted but not modelled, as given. */
  ignored: string[];
}

export class FlagError extends Error {}

/** `-tp`, `--port` are flags; `-3` and `-` are values. */
export const looksLikeFlag = (s: string) => /^--?[A-Za-z]/.test(s);

const BOOL_TEXT: Record<string, boolean> = {
  true: true,
  false: false,
  "1": true,
  "0": false,
  yes: true,
  no: false,
};

/**
 * vLLM's API server is uvicorn with `timeout_keep_alive` from this variable
 * (seconds, default 5): idle connections are closed that soon, which is
 * what a gateway in front of vLLM meets, so the sim does the same.
 */
export const KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE";
const DEFAULT_KEEP_ALIVE_SECONDS = 5;

function keepAliveSeconds(env: Readonly<Record<string, string | undefined>>): number {
  const text = env[KEEP_ALIVE_ENV];
  if (text === undefined || text === "") return DEFAULT_KEEP_ALIVE_SECONDS;
  const seconds = Number(text);
  if (!Number.isFinite(seconds) || seconds <= 0) {
    throw new FlagError(`${KEEP_ALIVE_ENV}: expected a number of seconds above 0, got "${text}"`);
  }
  return seconds;
}

/** vLLM's variable for its API key, read when no `--api-key` is given. */
export const API_KEY_ENV = "VLLM_API_KEY";

/**
 * The keys, as vLLM's api_server picks them: the command line's when
 * `--api-key` is given (it "takes precedence over VLLM_API_KEY"), else the
 * variable; empty ones dropped, so an empty VLLM_API_KEY (or `--api-key ""`)
 * means no key.
 */
function apiKeysOf(cli: readonly string[] | undefined, env: Readonly<Record<string, string | undefined>>) {
  return (cli ?? [env[API_KEY_ENV] ?? ""]).filter((k) => k !== "");
}

/** `env` is read only for vLLM's own variables (KEEP_ALIVE_ENV, API_KEY_ENV). */
export function parseServeArgs(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = {},
): SimEngineFlags {
  const { raw, ignored, positional } = readWords(argv);
  if (positional.length > 1) throw new FlagError(`unexpected arguments: ${positional.slice(1).join(" ")}`);
  if (positional[0] !== undefined) {
    if (raw.model !== undefined && raw.model !== positional[0]) {
      throw new FlagError("the model is given twice (positional and --model)");
    }
    raw.model = positional[0];
  }
  if (raw.model === undefined)
    throw new FlagError("missing MODEL (usage: llmgw sim-engine serve MODEL [flags])");

  const f = parseFlags(Schema, raw);
  if (f["node-rank"] >= f.nnodes)
    throw new FlagError(`--node-rank ${f["node-rank"]} must be below --nnodes ${f.nnodes}`);
  if (f["enable-auto-tool-choice"] && f["tool-call-parser"] === undefined) {
    throw new FlagError("--enable-auto-tool-choice requires --tool-call-parser");
  }
  return {
    ...flagsOf(f, ignored),
    apiKeys: apiKeysOf(f["api-key"], env),
    httpKeepAliveSeconds: keepAliveSeconds(env),
  };
}

/**
 * The command line as flag → raw value, before the schema: vLLM's spellings
 * (`--a_b`, `--no-x`, `-tp`), and unknown flags set aside with their value.
 */
function readWords(argv: readonly string[]) {
  const raw: Record<string, unknown> = {};
  const ignored: string[] = [];
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (!arg.startsWith("-") || arg === "-" || /^-\d/.test(arg)) {
      positional.push(arg);
      continue;
    }
    const eq = arg.indexOf("=");
    let name = (eq >= 0 ? arg.slice(0, eq) : arg).replace(/^--?/, "").replace(/_/g, "-");
    let inline: string | undefined = eq >= 0 ? arg.slice(eq + 1) : undefined;
    name = SHORT[name] ?? name;
    let kind = KNOWN[name];
    if (kind === undefined && name.startsWith("no-") && KNOWN[name.slice(3)] === "bool") {
      name = name.slice(3);
      kind = "bool";
      if (inline !== undefined) throw new FlagError(`--no-${name} takes no value`);
      inline = "false";
    }
    const takesValue = (next: string | undefined) => next !== undefined && !looksLikeFlag(next);
    if (kind === undefined) {
      // Unknown: take the next word as its value unless it looks like a flag.
      let shown = arg;
      if (inline === undefined && takesValue(argv[i + 1])) shown += ` ${argv[++i]}`;
      ignored.push(shown);
      continue;
    }
    if (kind === "bool") {
      const text = inline ?? (argv[i + 1] !== undefined && argv[i + 1]! in BOOL_TEXT ? argv[++i]! : "true");
      const v = BOOL_TEXT[text.toLowerCase()];
      if (v === undefined) throw new FlagError(`--${name}: expected true or false, got "${text}"`);
      raw[name] = v;
      continue;
    }
    if (kind === "list") {
      const values: string[] = inline !== undefined ? [inline] : [];
      while (inline === undefined && takesValue(argv[i + 1])) values.push(argv[++i]!);
      if (values.length === 0) throw new FlagError(`--${name} needs at least one value`);
      raw[name] = values;
      continue;
    }
    let value = inline;
    if (value === undefined) {
      const next = argv[i + 1];
      if (next === undefined || looksLikeFlag(next)) throw new FlagError(`--${name} needs a value`);
      value = argv[++i]!;
    }
    raw[name] = value;
  }
  return { raw, ignored, positional };
}

/** The validated flags in the shape the engine is built from. */
function flagsOf(
  f: z.output<typeof Schema>,
  ignored: string[],
): Omit<SimEngineFlags, "apiKeys" | "httpKeepAliveSeconds"> {
  return {
    model: f.model,
    host: f.host,
    port: f.port,
    servedModelNames: f["served-model-name"] ?? [f.model],
    tensorParallelSize: f["tensor-parallel-size"],
    pipelineParallelSize: f["pipeline-parallel-size"],
    dataParallelSize: f["data-parallel-size"],
    nnodes: f.nnodes,
    nodeRank: f["node-rank"],
    ...(f["master-addr"] !== undefined ? { masterAddr: f["master-addr"] } : {}),
    ...(f["master-port"] !== undefined ? { masterPort: f["master-port"] } : {}),
    headless: f.headless,
    gpuMemoryUtilization: f["gpu-memory-utilization"],
    ...(f["max-model-len"] !== undefined ? { maxModelLen: f["max-model-len"] } : {}),
    maxNumSeqs: f["max-num-seqs"],
    maxNumBatchedTokens: f["max-num-batched-tokens"],
    enablePrefixCaching: f["enable-prefix-caching"],
    blockSize: f["block-size"],
    seed: f.seed,
    enablePromptTokensDetails: f["enable-prompt-tokens-details"],
    enableAutoToolChoice: f["enable-auto-tool-choice"],
    ...(f["tool-call-parser"] !== undefined ? { toolCallParser: f["tool-call-parser"] } : {}),
    sim: simOptionsOf(f),
    ignored,
  };
}

/** The validated `--sim-*` flags in the shape the engine is built from. */
export function simOptionsOf(f: z.output<typeof SIM_SCHEMA>): SimEngineFlags["sim"] {
  return {
    speed: f["sim-speed"],
    ...(f["sim-kv-blocks"] !== undefined ? { kvBlocks: f["sim-kv-blocks"] } : {}),
    gpuMemoryGiB: f["sim-gpu-memory-gib"],
    startupSeconds: f["sim-startup-seconds"],
    failRate: f["sim-fail-rate"],
    ...(f["sim-crash-after"] !== undefined ? { crashAfter: f["sim-crash-after"] } : {}),
    ...(f["sim-hang-after"] !== undefined ? { hangAfter: f["sim-hang-after"] } : {}),
    hangPhase: f["sim-hang-phase"],
    slowTokenMs: f["sim-slow-token-ms"],
    outputLen: f["sim-output-len"],
    ...(f["sim-weights-read-ms"] !== undefined ? { weightsReadMs: f["sim-weights-read-ms"] } : {}),
    ...(f["sim-prefill-us-per-token"] !== undefined
      ? { prefillUsPerToken: f["sim-prefill-us-per-token"] }
      : {}),
    ...(f["sim-per-seq-us"] !== undefined ? { perSeqUs: f["sim-per-seq-us"] } : {}),
    ...(f["sim-trace"] !== undefined ? { trace: f["sim-trace"] } : {}),
    quirks: new Set(f["sim-quirks"]),
  };
}

export const USAGE = `usage: llmgw sim-engine serve MODEL [vLLM flags] [--sim-* flags]
       llmgw sim-engine -m sglang.launch_server --model-path MODEL [SGLang flags] [--sim-* flags]

vLLM flags: --host --port --served-model-name NAME... --tensor-parallel-size/-tp
  --pipeline-parallel-size/-pp --data-parallel-size/-dp --nnodes --node-rank
  --master-addr --master-port --headless --gpu-memory-utilization --max-model-len
  --max-num-seqs --max-num-batched-tokens --[no-]enable-prefix-caching --block-size
  --seed --enable-prompt-tokens-details --enable-auto-tool-choice --tool-call-parser NAME
  --api-key KEY... (else VLLM_API_KEY: /v1 requests need Authorization: Bearer KEY)
  (other vLLM flags: accepted, ignored, warned)
sim flags: --sim-speed K --sim-kv-blocks N --sim-gpu-memory-gib G --sim-output-len N
  --sim-startup-seconds S --sim-fail-rate P --sim-crash-after N
  --sim-hang-after N --sim-hang-phase first-token|mid-stream --sim-slow-token-ms M
  --sim-weights-read-ms MS --sim-prefill-us-per-token US --sim-per-seq-us US
  --sim-trace FILE
  --sim-quirks QUIRK... (no-done usage-on-finish no-continuous-usage fastapi-errors pinned-model no-usage)
see docs/sim-engine.md
`;

/** Flags as `schema` reads them, or a FlagError naming the first flag it refused. */
export function parseFlags<T>(schema: z.ZodType<T>, raw: Record<string, unknown>): T {
  const parsed = schema.safeParse(raw);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0]!;
  const flag = issue.path.length > 0 ? `--${String(issue.path[0])}` : "flags";
  throw new FlagError(`${flag}: ${issue.message}`);
}
