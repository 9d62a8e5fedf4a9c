import { hostname, networkInterfaces } from "node:os";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { checkWithin, parseDuration } from "../common/duration.ts";
import { LISTEN_ADDRESS } from "../common/listen.ts";

export const AGENT_HELP = `usage: llmgw agent --control-plane URL --node NAME [flags]

  --control-plane URL     control plane agent listener (default http://127.0.0.1:7443)
  --node NAME             this node's name (default: the hostname)
  --join-token TOKEN      enroll with this token (from \`llmgw ctl tokens create\`) when the state
                          dir holds no client certificate yet; https:// control planes only
                          (default $LLMGW_JOIN_TOKEN, which keeps it out of the process list)
  --ca-file PATH          trust this CA certificate instead of pinning the one the token names
  --simulate-gpus SPEC    play a GPU node: 8xH100-80GB, or 4xH100-80GB,4xA100-40GB
  --simulate-foreign I=MIB  simulated VRAM held by a foreign process on GPU I (repeatable)
  --fabric KEY=VALUE      operator-given fabric label, e.g. ib=island-a (repeatable);
                          multi-node replicas are placed only on nodes sharing one
  --advertise-address H   address engines on this node are reached at (default: first non-loopback IPv4)
  --state-dir DIR         where the agent keeps engine state across restarts (default .state/agent-NODE)
  --nvidia-smi PATH       nvidia-smi binary (default nvidia-smi)
  --vllm-bin PATH         vLLM launcher (default vllm)
  --sglang-bin PATH       Python used for SGLang (default python)
  --ping-interval DUR     HTTP/2 ping interval (default 10s)
  --ping-timeout DUR      HTTP/2 ping timeout (default 5s)
  --stable-after DUR      a session this long resets the reconnect backoff (default 10s)
  --scrape-interval DUR   engine /metrics scrape interval until a control plane sets its
                          router.scrape_interval (default 2s)
  --metrics-listen ADDR   serve the agent's Prometheus metrics at http://ADDR/metrics, e.g.
                          10.0.0.5:9100 (HOST:PORT or :PORT; off by default; no auth: bind it to a
                          management address)
  --stop-engines-on-exit  on SIGINT or SIGTERM, stop every engine (SIGTERM, then SIGKILL after its
                          stop grace) and forget it before exiting; by default engines keep serving
                          and the next agent on this state dir adopts them
`;

export interface AgentFlags {
  controlPlane: string;
  node: string;
  /** mTLS enrollment (https:// only): used when the state dir has no certificate. */
  joinToken: string | undefined;
  caFile: string | undefined;
  simulateGpus: string | undefined;
  simulateForeign: Map<number, number>;
  fabric: Record<string, string>;
  advertiseAddress: string;
  stateDir: string;
  nvidiaSmi: string;
  vllmBin: string;
  sglangBin: string;
  pingIntervalMs: number;
  pingTimeoutMs: number;
  stableAfterMs: number;
  scrapeIntervalMs: number;
  /** `--metrics-listen`: where to serve /metrics; undefined: not served. */
  metricsListen: string | undefined;
  /** Stop engines when the agent exits (the local stack), instead of leaving them for the next agent. */
  stopEnginesOnExit: boolean;
  /** Hidden (tests, local stack): the supervisor's restart backoff and orphan grace. */
  restartBackoffMs: number | undefined;
  restartMaxBackoffMs: number | undefined;
  orphanGraceMs: number | undefined;
}

function defaultAddress(): string {
  for (const addrs of Object.values(networkInterfaces())) {
    for (const a of addrs ?? []) if (a.family === "IPv4" && !a.internal) return a.address;
  }
  return "127.0.0.1";
}

function pairs(values: string[] | undefined, flag: string): [string, string][] {
  return (values ?? []).map((v) => {
    const i = v.indexOf("=");
    if (i <= 0) throw new Error(`${flag}: "${v}" is not KEY=VALUE`);
    return [v.slice(0, i), v.slice(i + 1)];
  });
}

/** A path with a slash is resolved now: engines start in their own working directory. */
function binary(v: string): string {
  return v.includes("/") ? resolve(v) : v;
}

function dur(v: string | undefined, flag: string, fallback: number): number {
  if (v === undefined) return fallback;
  try {
    return parseDuration(v);
  } catch (err) {
    throw new Error(`${flag}: ${(err as Error).message}`);
  }
}

/** A duration flag that drives a timer: its value or default, within [min, max] (common/duration.ts). */
function timer(v: string | undefined, flag: string, fallback: string, min: string, max: string): number {
  return checkWithin(dur(v, flag, parseDuration(fallback)), flag, min, max);
}

function optDur(v: string | undefined, flag: string): number | undefined {
  return v === undefined ? undefined : dur(v, flag, 0);
}

export function parseAgentFlags(argv: string[]): AgentFlags | "help" {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      "control-plane": { type: "string" },
      node: { type: "string" },
      "join-token": { type: "string" },
      "ca-file": { type: "string" },
      "simulate-gpus": { type: "string" },
      "simulate-foreign": { type: "string", multiple: true },
      fabric: { type: "string", multiple: true },
      "advertise-address": { type: "string" },
      "state-dir": { type: "string" },
      "nvidia-smi": { type: "string" },
      "vllm-bin": { type: "string" },
      "sglang-bin": { type: "string" },
      "ping-interval": { type: "string" },
      "ping-timeout": { type: "string" },
      "stable-after": { type: "string" },
      "scrape-interval": { type: "string" },
      "stop-engines-on-exit": { type: "boolean" },
      "metrics-listen": { type: "string" },
      // Hidden: not in AGENT_HELP, for tests and the local stack.
      "restart-backoff": { type: "string" },
      "restart-max-backoff": { type: "string" },
      "orphan-grace": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) return "help";
  const node = values.node ?? hostname();
  const fabric: Record<string, string> = {};
  for (const [k, v] of pairs(values.fabric, "--fabric")) {
    if (!/^[A-Za-z0-9._/-]{1,63}$/.test(k))
      throw new Error(`--fabric: label key "${k}" must be 1-63 of A-Z a-z 0-9 . _ / -`);
    fabric[k] = v;
  }
  const simulateForeign = new Map<number, number>();
  for (const [k, v] of pairs(values["simulate-foreign"], "--simulate-foreign")) {
    if (!/^\d+$/.test(k) || !/^\d+$/.test(v))
      throw new Error(`--simulate-foreign: "${k}=${v}" is not GPU_INDEX=MIB`);
    simulateForeign.set(Number(k), Number(v));
  }
  const controlPlane = values["control-plane"] ?? "http://127.0.0.1:7443";
  if (!/^https?:\/\/[^/]+/.test(controlPlane))
    throw new Error(`--control-plane: "${controlPlane}" is not an http(s) URL`);
  const secure = controlPlane.startsWith("https://");
  if (!secure && (values["join-token"] !== undefined || values["ca-file"] !== undefined))
    throw new Error("--join-token and --ca-file need an https:// --control-plane (mTLS)");
  const metricsListen = values["metrics-listen"];
  if (metricsListen !== undefined && !LISTEN_ADDRESS.test(metricsListen))
    throw new Error(`--metrics-listen: "${metricsListen}" is not HOST:PORT or :PORT`);
  return {
    controlPlane,
    node,
    metricsListen,
    joinToken: values["join-token"] ?? process.env.LLMGW_JOIN_TOKEN,
    caFile: values["ca-file"] === undefined ? undefined : resolve(values["ca-file"]),
    simulateGpus: values["simulate-gpus"],
    simulateForeign,
    fabric,
    advertiseAddress: values["advertise-address"] ?? defaultAddress(),
    stateDir: values["state-dir"] ?? `.state/agent-${node}`,
    nvidiaSmi: values["nvidia-smi"] ?? "nvidia-smi",
    vllmBin: binary(values["vllm-bin"] ?? "vllm"),
    sglangBin: binary(values["sglang-bin"] ?? "python"),
    pingIntervalMs: timer(values["ping-interval"], "--ping-interval", "10s", "100ms", "1h"),
    pingTimeoutMs: timer(values["ping-timeout"], "--ping-timeout", "5s", "100ms", "1h"),
    stableAfterMs: timer(values["stable-after"], "--stable-after", "10s", "0s", "24h"),
    scrapeIntervalMs: timer(values["scrape-interval"], "--scrape-interval", "2s", "100ms", "1h"),
    stopEnginesOnExit: values["stop-engines-on-exit"] ?? false,
    restartBackoffMs: optDur(values["restart-backoff"], "--restart-backoff"),
    restartMaxBackoffMs: optDur(values["restart-max-backoff"], "--restart-max-backoff"),
    orphanGraceMs: optDur(values["orphan-grace"], "--orphan-grace"),
  };
}
