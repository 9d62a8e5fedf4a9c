/**
 * The sim engine playing SGLang over HTTP. Inference is the sim's own engine
 * (SimServer); around it, what SGLang's FastAPI app does
 * (python/sglang/srt/entrypoints/http_server.py unless said otherwise):
 *
 * - `/health` and `/health_generate` answer 200 (empty) after a second:
 *   SGLang runs a one-token generation and looks, a second later, for any
 *   output of the scheduler since it asked, so even an idle or a busy
 *   server takes about a second (a stalled one, whose 503 comes after 20 s,
 *   is not modelled); SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false makes
 *   `/health` answer at once (http_server.py, health_generate);
 * - `/server_info`, `/get_server_info`, `/model_info`, `/get_model_info`,
 *   `/v1/models`, `/v1/models/{model}`, `/ping`;
 * - `/metrics` only with --enable-metrics (utils add_prometheus_middleware
 *   mounts it); without, FastAPI's 404 `{"detail":"Not Found"}`, as for any
 *   route it does not have;
 * - POSTs to /v1/* must say `Content-Type: application/json`
 *   (validate_json_request), else a 400;
 * - with --api-key, every route but /health* and /metrics* needs
 *   `Authorization: Bearer KEY`, else 401 `{"error":"Unauthorized"}`
 *   (utils add_api_key_middleware; api-key.ts, which the vLLM persona's
 *   rule shares the comparison and the refusal with);
 * - any `model` is served and echoed back, "default" when the request names
 *   none (openai/protocol.py's default; the Python OpenAI routes check no
 *   model name), and ids are bare 32-hex request ids (io_struct.py's rid);
 * - a completion without max_tokens gets 16 (protocol.py CompletionRequest);
 * - `continuous_usage_stats` works without `include_usage`
 *   (openai/utils.py, should_include_usage);
 * - context limits and their messages are the tokenizer manager's
 *   (managers/tokenizer_manager.py, _validate_one_request) and the
 *   scheduler's (max_req_input_len).
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "../common/log.ts";
import type { UsageMode } from "../common/usage-mode.ts";
import {
  type Secrets,
  sglangAuthorized,
  sglangSecrets,
  UNAUTHORIZED_BODY,
  UNAUTHORIZED_STATUS,
} from "./api-key.ts";
import type { GenerationSpec } from "./generation.ts";
import type { Persona, StreamOptionsLike } from "./persona.ts";
import { ApiError } from "./protocol.ts";
import type { Runner } from "./runner.ts";
import type { SglangFlags } from "./sglang-flags.ts";
import { renderSglangMetrics, type SglangRequestMetrics } from "./sglang-metrics.ts";
import { modelCard, modelInfo, serverInfo } from "./sglang-server-info.ts";
import type { SglangSizing } from "./sglang-sizing.ts";
import { SGLANG_WIRE, sglangEmbeddingsBody, sglangErrorBody, sglangStreamErrorTail } from "./sglang-wire.ts";

/** Llama 3's `<|eot_id|>`: what SGLang reports as `matched_stop` when the model ends a choice itself. */
const EOS_TOKEN_ID = 128009;

/** SGLang's wait between its health check's looks at the scheduler (http_server.py: asyncio.sleep(1)). */
export const HEALTH_CHECK_WAIT_MS = 1000;

export const HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION";

const INFERENCE = new Set(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]);

export interface SglangPersonaOptions {
  flags: SglangFlags;
  sizing: SglangSizing;
  runner: Runner;
  requests: SglangRequestMetrics;
  log: Logger;
  env: Readonly<Record<string, string | undefined>>;
}

export class SglangPersona implements Persona {
  readonly wire = SGLANG_WIRE;
  readonly eosTokenId = EOS_TOKEN_ID;
  readonly observer: SglangRequestMetrics;
  private readonly o: SglangPersonaOptions;
  private readonly created = Math.floor(Date.now() / 1000);
  /** SGLang's environment flag, read as its get_bool_env_var does: "true" or "1"; on when unset. */
  private readonly healthGenerates: boolean;
  /** `--api-key` as the header it must equal. */
  private readonly bearer: Secrets;

  constructor(o: SglangPersonaOptions) {
    this.o = o;
    this.observer = o.requests;
    this.bearer = sglangSecrets(o.flags.apiKey);
    const v = o.env[HEALTH_GENERATION_ENV];
    this.healthGenerates = v === undefined || ["true", "1"].includes(v.toLowerCase());
  }

  route(req: IncomingMessage, res: ServerResponse, path: string, method: string): boolean {
    if (!sglangAuthorized(this.bearer, path, method, req.headers.authorization)) {
      req.resume();
      res
        .writeHead(UNAUTHORIZED_STATUS, {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(UNAUTHORIZED_BODY),
        })
        .end(UNAUTHORIZED_BODY);
      return true;
    }
    if (INFERENCE.has(path)) return this.inference(req, res, method);
    req.resume();
    const answer = this.get(path);
    if (answer === undefined) send(res, 404, { detail: "Not Found" });
    else if (method !== "GET") send(res, 405, { detail: "Method Not Allowed" });
    else answer(res);
    return true;
  }

  /** A POST to an OpenAI route goes on to the engine once its content type is JSON. */
  private inference(req: IncomingMessage, res: ServerResponse, method: string): boolean {
    if (method !== "POST") {
      req.resume();
      send(res, 405, { detail: "Method Not Allowed" });
      return true;
    }
    const media = String(req.headers["content-type"] ?? "")
      .split(";")[0]!
      .trim()
      .toLowerCase();
    if (media === "application/json") return false;
    req.resume();
    const e = new ApiError(
      400,
      `[{'loc': ('header', 'content-type'), 'msg': "Unsupported Media Type: Only 'application/json' is allowed", 'type': 'value_error'}]`,
    );
    e.validation = true;
    res.writeHead(400, { "content-type": "application/json" }).end(sglangErrorBody(e));
    return true;
  }

  /** The GET routes, by path; undefined for a path SGLang does not have. */
  private get(path: string): ((res: ServerResponse) => void) | undefined {
    const { flags, sizing } = this.o;
    switch (path) {
      case "/health":
      case "/health_generate":
        return (res) => this.health(res, path);
      case "/ping":
        return (res) => res.writeHead(200, { "content-length": "0" }).end();
      case "/get_model_info":
      case "/model_info":
        return (res) => {
          this.deprecated(path, "/get_model_info", "/model_info");
          send(res, 200, modelInfo(flags));
        };
      case "/get_server_info":
      case "/server_info":
        return (res) => {
          this.deprecated(path, "/get_server_info", "/server_info");
          send(res, 200, this.serverInfo());
        };
      case "/v1/models":
        return (res) =>
          send(res, 200, {
            object: "list",
            data: [modelCard(flags.servedModelName, sizing.contextLength, this.created)],
          });
      case "/metrics":
        return flags.enableMetrics ? (res) => this.metrics(res) : undefined;
    }
    if (path.startsWith("/v1/models/")) return (res) => this.model_(res, decodeURIComponent(path.slice(11)));
    return undefined;
  }

  private deprecated(path: string, old: string, current: string): void {
    if (path !== old) return;
    this.o.log.warn(
      `Endpoint '${old}' is deprecated and will be removed in a future version. Please use '${current}' instead.`,
    );
  }

  /** The second SGLang's generating check takes; `/health` at once when that is turned off. */
  private health(res: ServerResponse, path: string): void {
    if (!this.healthGenerates && path === "/health") {
      res.writeHead(200, { "content-length": "0" }).end();
      return;
    }
    const timer = setTimeout(() => {
      if (!res.destroyed) res.writeHead(200, { "content-length": "0" }).end();
    }, HEALTH_CHECK_WAIT_MS);
    res.on("close", () => clearTimeout(timer));
  }

  private serverInfo(): unknown {
    const ranks = this.o.runner.cores.map((c) => ({ lastGenThroughput: c.recent.genThroughput }));
    return serverInfo(this.o.flags, this.o.sizing, ranks);
  }

  private model_(res: ServerResponse, name: string): void {
    const { flags, sizing } = this.o;
    if (name === flags.servedModelName) {
      send(res, 200, modelCard(name, sizing.contextLength, this.created));
      return;
    }
    send(res, 404, {
      error: {
        message: `The model '${name}' does not exist`,
        type: "invalid_request_error",
        param: "model",
        code: "model_not_found",
      },
    });
  }

  private metrics(res: ServerResponse): void {
    const { flags, sizing, runner } = this.o;
    const text = renderSglangMetrics(
      runner.cores.map((c) => ({ gauges: c.gauges(), recent: c.recent })),
      this.observer,
      {
        modelName: flags.servedModelName,
        maxTotalNumTokens: sizing.maxTotalNumTokens,
        tpSize: flags.tpSize,
        allSchedulers: flags.enableMetricsForAllSchedulers,
        simLagSeconds: runner.lagSeconds,
      },
    );
    res.writeHead(200, {
      "content-type": "text/plain; version=0.0.4; charset=utf-8",
      "content-length": Buffer.byteLength(text),
    });
    res.end(text);
  }

  model(requested: string | null | undefined): string {
    return typeof requested === "string" ? requested : "default";
  }

  newId(kind: GenerationSpec["kind"]): string {
    const hex = randomUUID().replace(/-/g, "");
    return kind === "response" ? `resp_${hex}` : hex;
  }

  errorBody(e: ApiError): string {
    return sglangErrorBody(e);
  }

  streamErrorTail(e: ApiError): string {
    return sglangStreamErrorTail(e);
  }

  outputLimit(_kind: GenerationSpec["kind"], prompt: number, asked: number | undefined): number {
    const { contextLength: ctx, maxReqLen, maxReqInputLen } = this.o.sizing;
    if (prompt >= ctx) {
      throw new ApiError(
        400,
        `The input (${prompt} tokens) is longer than the model's context length (${ctx} tokens).`,
      );
    }
    if (asked !== undefined && asked + prompt >= ctx) {
      throw new ApiError(
        400,
        `Requested token count exceeds the model's maximum context length of ${ctx} tokens. You requested a total of ${asked + prompt} tokens: ${prompt} tokens from the input messages and ${asked} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.`,
      );
    }
    if (prompt >= maxReqInputLen) {
      throw new ApiError(
        400,
        `Input length (${prompt} tokens) exceeds the maximum allowed length (${maxReqInputLen} tokens). Use a shorter input or enable --allow-auto-truncate.`,
      );
    }
    // The scheduler cuts every request to what its KV pool can hold (scheduler.py, handle_generate_request).
    const room = maxReqLen - prompt - 1;
    return Math.max(1, Math.min(asked ?? room, room));
  }

  defaultMaxTokens(kind: GenerationSpec["kind"]): number | undefined {
    return kind === "completion" ? 16 : undefined;
  }

  usage(opts: StreamOptionsLike | null | undefined): { mode: UsageMode; final: boolean } {
    const final = Boolean(opts?.include_usage) || this.o.flags.streamResponseDefaultIncludeUsage;
    const mode: UsageMode = opts?.continuous_usage_stats ? "continuous" : final ? "final" : "none";
    return { mode, final };
  }

  embeddingsBody(model: string, vectors: readonly string[], promptTokens: number): string {
    return sglangEmbeddingsBody(model, vectors, promptTokens);
  }
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
