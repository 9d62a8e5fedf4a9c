/**
 * `llmgw sim-engine -m sglang.launch_server [SGLang flags] [--sim-* flags]`:
 * SGLang's command line (python/sglang/srt/server_args.py), so the agent's
 * SGLang adapter (agent/engines/sglang.ts) can launch the sim engine as it
 * launches SGLang. `--flag value` and `--flag=value`; SGLang's booleans are
 * argparse `store_true` switches that take no value (`--flag=false` is
 * accepted too). Flags SGLang has but the sim does not model are accepted
 * with a warning, as the vLLM persona does, because a fleet must not fail to
 * start over a tuning flag; SGLang's argparse takes no positional argument,
 * so a stray word is refused.
 */
import { z } from "zod";
import {
  FlagError,
  type Kind,
  looksLikeFlag,
  parseFlags,
  SIM_KINDS,
  SIM_SHAPE,
  type SimEngineFlags,
  simOptionsOf,
} from "./flags.ts";

const KNOWN: Record<string, Kind> = {
  "model-path": "string",
  "tokenizer-path": "string",
  host: "string",
  port: "int",
  "tp-size": "int",
  "pp-size": "int",
  "dp-size": "int",
  nnodes: "int",
  "node-rank": "int",
  "dist-init-addr": "string",
  "served-model-name": "string",
  "mem-fraction-static": "number",
  "enable-metrics": "bool",
  "enable-metrics-for-all-schedulers": "bool",
  "max-running-requests": "int",
  "max-total-tokens": "int",
  "context-length": "int",
  "page-size": "int",
  "disable-radix-cache": "bool",
  "chunked-prefill-size": "int",
  "max-prefill-tokens": "int",
  "trust-remote-code": "bool",
  "log-level": "string",
  "api-key": "string",
  "enable-dp-attention": "bool",
  "random-seed": "int",
  "enable-cache-report": "bool",
  "stream-response-default-include-usage": "bool",
  "tool-call-parser": "string",
  ...SIM_KINDS,
};

/** SGLang's other spellings of the same flags (its argparse aliases, and its --tp shorthand). */
const ALIASES: Record<string, string> = {
  model: "model-path",
  "tensor-parallel-size": "tp-size",
  tp: "tp-size",
  "pipeline-parallel-size": "pp-size",
  "data-parallel-size": "dp-size",
  dp: "dp-size",
};

const int = (min: number) => z.coerce.number().int().min(min);

/** `host:port` (an IPv6 host in brackets), as SGLang splits it for its rendezvous. */
const hostPort = z
  .string()
  .regex(/^(\[[0-9A-Fa-f:.]+\]|[^:\s[\]]+):\d{1,5}$/, "expected HOST:PORT")
  .refine((s) => Number(s.slice(s.lastIndexOf(":") + 1)) <= 65535, "port out of range");

const Schema = z.object({
  "model-path": z.string().min(1, "is required"),
  "tokenizer-path": z.string().min(1).optional(),
  host: z.string().min(1).default("127.0.0.1"),
  port: int(0).max(65535).default(30000),
  "tp-size": int(1).default(1),
  "pp-size": int(1).default(1),
  "dp-size": int(1).default(1),
  nnodes: int(1).default(1),
  "node-rank": int(0).default(0),
  "dist-init-addr": hostPort.optional(),
  "served-model-name": z.string().min(1).optional(),
  "mem-fraction-static": z.coerce.number().gt(0).lt(1).optional(),
  "enable-metrics": z.boolean().default(false),
  "enable-metrics-for-all-schedulers": z.boolean().default(false),
  "max-running-requests": int(1).optional(),
  "max-total-tokens": int(1).optional(),
  "context-length": int(1).optional(),
  "page-size": int(1).max(1024).default(1),
  "disable-radix-cache": z.boolean().default(false),
  // -1 (or 0) turns chunked prefill off, as in SGLang.
  "chunked-prefill-size": int(-1).optional(),
  "max-prefill-tokens": int(1).default(16384),
  "trust-remote-code": z.boolean().default(false),
  // Python's logging refuses other names, so SGLang would not start either.
  "log-level": z.enum(["debug", "info", "warning", "error", "critical"]).default("info"),
  "api-key": z.string().min(1).optional(),
  "enable-dp-attention": z.boolean().default(false),
  "random-seed": z.coerce.number().int().optional(),
  "enable-cache-report": z.boolean().default(false),
  "stream-response-default-include-usage": z.boolean().default(false),
  "tool-call-parser": z.string().min(1).optional(),
  ...SIM_SHAPE,
});

type Parsed = z.output<typeof Schema>;

export interface SglangFlags {
  modelPath: string;
  tokenizerPath: string;
  host: string;
  port: number;
  tpSize: number;
  ppSize: number;
  dpSize: number;
  nnodes: number;
  nodeRank: number;
  distInitAddr?: string;
  /** SGLang serves one name: `--served-model-name`, else the model path. */
  servedModelName: string;
  /** Given; else SGLang's default for the TP size (sglang-sizing.ts). */
  memFractionStatic?: number;
  enableMetrics: boolean;
  enableMetricsForAllSchedulers: boolean;
  maxRunningRequests?: number;
  maxTotalTokens?: number;
  contextLength?: number;
  pageSize: number;
  disableRadixCache: boolean;
  chunkedPrefillSize?: number;
  maxPrefillTokens: number;
  trustRemoteCode: boolean;
  logLevel: string;
  apiKey?: string;
  enableDpAttention: boolean;
  randomSeed?: number;
  enableCacheReport: boolean;
  streamResponseDefaultIncludeUsage: boolean;
  toolCallParser?: string;
  sim: SimEngineFlags["sim"];
  /** Flags accepted but not modelled, as given. */
  ignored: string[];
}

/** The words after `-m sglang.launch_server`. */
export function parseSglangArgs(argv: readonly string[]): SglangFlags {
  const { raw, ignored } = readWords(argv);
  const f = parseFlags(Schema, raw);
  if (f["node-rank"] >= f.nnodes) {
    throw new FlagError(`--node-rank ${f["node-rank"]} must be below --nnodes ${f.nnodes}`);
  }
  return flagsOf(f, ignored);
}

/** The command line as flag → raw value, before the schema; unknown flags set aside with their value. */
function readWords(argv: readonly string[]): { raw: Record<string, unknown>; ignored: string[] } {
  const raw: Record<string, unknown> = { "model-path": "" };
  const ignored: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (!looksLikeFlag(arg)) throw new FlagError(`unrecognized arguments: ${argv.slice(i).join(" ")}`);
    const eq = arg.indexOf("=");
    const given = (eq >= 0 ? arg.slice(0, eq) : arg).replace(/^--?/, "").replace(/_/g, "-");
    const inline = eq >= 0 ? arg.slice(eq + 1) : undefined;
    const name = ALIASES[given] ?? given;
    const kind = KNOWN[name];
    const next = argv[i + 1];
    // A value may look like a negative number (--chunked-prefill-size -1), never like a flag.
    const valueNext = next !== undefined && (!looksLikeFlag(next) || /^-\d/.test(next));
    if (kind === undefined) {
      ignored.push(inline === undefined && valueNext ? `${arg} ${argv[++i]}` : arg);
      continue;
    }
    if (kind === "bool") {
      const v = inline === undefined ? true : { true: true, false: false }[inline.toLowerCase()];
      if (v === undefined) throw new FlagError(`--${name}: a switch, expected no value or true/false`);
      raw[name] = v;
      continue;
    }
    if (kind === "list") {
      const values = inline !== undefined ? [inline] : [];
      while (inline === undefined && i + 1 < argv.length && !looksLikeFlag(argv[i + 1]!))
        values.push(argv[++i]!);
      raw[name] = values;
    } else if (inline !== undefined) raw[name] = inline;
    else if (valueNext) raw[name] = argv[++i];
    else throw new FlagError(`--${name}: expected one argument`);
  }
  return { raw, ignored };
}

function flagsOf(f: Parsed, ignored: string[]): SglangFlags {
  const opt = <K extends keyof Parsed, N extends string>(key: K, as: N) =>
    (f[key] !== undefined ? { [as]: f[key] } : {}) as { [P in N]?: NonNullable<Parsed[K]> };
  return {
    modelPath: f["model-path"],
    tokenizerPath: f["tokenizer-path"] ?? f["model-path"],
    host: f.host,
    port: f.port,
    tpSize: f["tp-size"],
    ppSize: f["pp-size"],
    dpSize: f["dp-size"],
    nnodes: f.nnodes,
    nodeRank: f["node-rank"],
    ...opt("dist-init-addr", "distInitAddr"),
    servedModelName: f["served-model-name"] ?? f["model-path"],
    ...opt("mem-fraction-static", "memFractionStatic"),
    enableMetrics: f["enable-metrics"],
    enableMetricsForAllSchedulers: f["enable-metrics-for-all-schedulers"],
    ...opt("max-running-requests", "maxRunningRequests"),
    ...opt("max-total-tokens", "maxTotalTokens"),
    ...opt("context-length", "contextLength"),
    pageSize: f["page-size"],
    disableRadixCache: f["disable-radix-cache"],
    ...opt("chunked-prefill-size", "chunkedPrefillSize"),
    maxPrefillTokens: f["max-prefill-tokens"],
    trustRemoteCode: f["trust-remote-code"],
    logLevel: f["log-level"],
    ...opt("api-key", "apiKey"),
    enableDpAttention: f["enable-dp-attention"],
    ...opt("random-seed", "randomSeed"),
    enableCacheReport: f["enable-cache-report"],
    streamResponseDefaultIncludeUsage: f["stream-response-default-include-usage"],
    ...opt("tool-call-parser", "toolCallParser"),
    sim: simOptionsOf(f),
    ignored,
  };
}

export const SGLANG_USAGE = `usage: llmgw sim-engine -m sglang.launch_server --model-path MODEL [SGLang flags] [--sim-* flags]

SGLang flags: --host (127.0.0.1) --port (30000) --tp/--tp-size --pp-size --dp-size
  --nnodes --node-rank --dist-init-addr HOST:PORT --served-model-name NAME
  --mem-fraction-static F --enable-metrics --max-running-requests N --max-total-tokens N
  --context-length N --page-size N --disable-radix-cache --chunked-prefill-size N
  --max-prefill-tokens N --trust-remote-code --log-level L --api-key KEY
  --enable-dp-attention --random-seed N --enable-cache-report
  --stream-response-default-include-usage --tool-call-parser NAME
  (other SGLang flags: accepted, ignored, warned)
sim flags: as for \`llmgw sim-engine serve\`
see docs/sim-engine.md, "The SGLang persona"
`;
