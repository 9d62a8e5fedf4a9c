/**
 * The load generator's HTTP side: one streamed chat completion per workload
 * request against any OpenAI-compatible base URL, timed from the client's
 * side, and the two ways of offering load (open loop: each request at its
 * scheduled time, Poisson; closed loop: N workers, each sending its next
 * request when the last one ends).
 *
 * node:http with a keep-alive agent rather than fetch: hundreds of
 * concurrent streams from one core, and the client must stay cheaper than
 * what it measures.
 */
import { Agent as HttpAgent, request as httpRequest, type RequestOptions } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { doublingDelay } from "../common/backoff.ts";
import { ChatStream, chatRequest, describeError, MAX_ERROR_BODY, readText } from "./chat-stream.ts";
import { percentile, type RequestResult } from "./stats.ts";
import type { WorkloadRequest } from "./workloads.ts";

export interface Target {
  /** Base URL without `/v1`, e.g. http://127.0.0.1:8787. */
  url: string;
  model: string;
  apiKey?: string;
  /** Sent with every request (before the request's own x-session-id and x-llmgw-band). */
  headers: Record<string, string>;
  /** Real milliseconds before a request is abandoned as `timeout`. */
  timeoutMs: number;
  /**
   * The target's clock runs this many times faster than real time (a sim
   * engine's --sim-speed): schedules are divided by it, measured durations
   * multiplied, so every figure is in the target's time.
   */
  timeScale: number;
  /** Response headers to keep on each result (lower case). */
  record: readonly string[];
}

const FREE_SOCKET_MS = 2_000;

export class Client {
  private readonly agent: HttpAgent;
  private readonly send_: typeof httpRequest;
  private readonly base: URL;

  constructor(readonly target: Target) {
    this.base = new URL(target.url);
    const https = this.base.protocol === "https:";
    // A pooled socket idle for FREE_SOCKET_MS is closed rather than reused: servers drop idle
    // connections after about 5 s (workerd, Node), and a busy one that reads a request late drops it
    // with the request unanswered (ECONNRESET; seen with the edge in workerd under load).
    const agentOptions = { keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, timeout: FREE_SOCKET_MS };
    this.agent = https ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
    this.send_ = https ? httpsRequest : httpRequest;
  }

  private options(method: string, path: string, headers: Record<string, string | number>): RequestOptions {
    return {
      protocol: this.base.protocol,
      hostname: this.base.hostname,
      port: this.base.port,
      path: `${this.base.pathname.replace(/\/$/, "")}${path}`,
      method,
      agent: this.agent,
      headers: {
        ...this.target.headers,
        ...(this.target.apiKey ? { authorization: `Bearer ${this.target.apiKey}` } : {}),
        ...headers,
      },
    };
  }

  /** GET /v1/models: the names served, or the status and error when refused. Throws when unreachable. */
  models(timeoutMs = 10_000): Promise<{ status: number; models: string[]; error?: string }> {
    return new Promise((resolve, reject) => {
      const req = this.send_(this.options("GET", "/v1/models", {}), (res) => {
        readText(res, MAX_ERROR_BODY).then((text) => {
          if (res.statusCode !== 200) {
            resolve({ status: res.statusCode ?? 0, models: [], error: describeError(text).message });
            return;
          }
          try {
            const body = JSON.parse(text) as { data?: { id?: unknown }[] };
            const models = (body.data ?? []).flatMap((m) => (typeof m.id === "string" ? [m.id] : []));
            resolve({ status: 200, models });
          } catch {
            resolve({ status: 200, models: [], error: `not a model list: ${text.slice(0, 200)}` });
          }
        }, reject);
      });
      req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
      req.on("error", reject);
      req.end();
    });
  }

  /** One streamed chat completion; never rejects: failures are results too. */
  send(r: WorkloadRequest): Promise<RequestResult> {
    const { body, headers } = chatRequest(this.target.model, r);
    return new Promise((resolve) => {
      const stream = new ChatStream(r, this.target, resolve);
      const req = this.send_(this.options("POST", "/v1/chat/completions", headers), (res) =>
        stream.read(res),
      );
      stream.abandonAfter(this.target.timeoutMs, () => req.destroy());
      req.on("error", (err: NodeJS.ErrnoException) => stream.requestFailed(err));
      req.end(body);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

export interface LoopStop {
  /** Send at most this many requests. */
  count?: number;
  /** Open loop: send requests scheduled before this (target seconds). Closed loop: start none after it. */
  seconds?: number;
}

export interface LoopResult {
  /** Target seconds from the first request sent to the last one finished. */
  seconds: number;
  sent: number;
  /** Open loop: how late requests left against their schedule, target seconds (p99, max). */
  late?: { p99: number; max: number };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Tracks in-flight sends so a loop can wait for the last one. */
function inflight() {
  let n = 0;
  let wake: (() => void) | undefined;
  return {
    add(p: Promise<void>) {
      n++;
      void p.then(() => {
        if (--n === 0) wake?.();
      });
    },
    drained: () => (n === 0 ? Promise.resolve() : new Promise<void>((r) => (wake = r))),
  };
}

/** Each request leaves at its `at` (target seconds after the start), whatever is still in flight. */
export async function openLoop(
  client: Client,
  requests: Iterator<WorkloadRequest>,
  stop: LoopStop,
  onResult: (r: RequestResult) => void,
): Promise<LoopResult> {
  const scale = client.target.timeScale;
  const pending = inflight();
  const late: number[] = [];
  const t0 = performance.now();
  let sent = 0;
  while (stop.count === undefined || sent < stop.count) {
    const r = requests.next().value as WorkloadRequest;
    if (stop.seconds !== undefined && r.at >= stop.seconds) break;
    const due = t0 + (r.at / scale) * 1000;
    // setTimeout is good to about a millisecond; requests due sooner go now.
    if (due - performance.now() >= 1) await sleep(due - performance.now());
    late.push(Math.max(0, performance.now() - due));
    pending.add(client.send(r).then(onResult));
    sent++;
  }
  await pending.drained();
  late.sort((a, b) => a - b);
  const target = (realMs: number) => (realMs / 1000) * scale;
  return {
    seconds: target(performance.now() - t0),
    sent,
    ...(late.length > 0 ? { late: { p99: target(percentile(late, 99)!), max: target(late.at(-1)!) } } : {}),
  };
}

/**
 * After a failure a closed-loop worker waits before its next request: 100 ms,
 * doubling to 2 s, until a request succeeds. A client that fails instantly
 * (a dead target refuses the connection in microseconds) would otherwise
 * send tens of thousands of requests a second, measuring nothing.
 */
const FAILURE_BACKOFF = { baseMs: 100, maxMs: 2_000 };

/**
 * `concurrency` workers, each sending its next request as soon as its last
 * one ends — or, after a failure, once its backoff has passed.
 */
export async function closedLoop(
  client: Client,
  requests: Iterator<WorkloadRequest>,
  concurrency: number,
  stop: LoopStop,
  onResult: (r: RequestResult) => void,
): Promise<LoopResult> {
  const scale = client.target.timeScale;
  const t0 = performance.now();
  const deadline = stop.seconds === undefined ? Number.POSITIVE_INFINITY : t0 + (stop.seconds / scale) * 1000;
  let sent = 0;
  const worker = async () => {
    let failures = 0;
    while ((stop.count === undefined || sent < stop.count) && performance.now() < deadline) {
      if (failures > 0) {
        const wait = doublingDelay(failures, FAILURE_BACKOFF.baseMs, FAILURE_BACKOFF.maxMs);
        await sleep(Math.min(wait, deadline - performance.now()));
        if (performance.now() >= deadline) break;
      }
      sent++;
      const result = await client.send(requests.next().value as WorkloadRequest);
      failures = result.ok ? 0 : failures + 1;
      onResult(result);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { seconds: ((performance.now() - t0) / 1000) * scale, sent };
}
