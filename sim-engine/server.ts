/**
 * The sim engine's HTTP surface, shaped like vLLM's OpenAI server:
 * /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings,
 * /v1/models, /health, /metrics (+ /ping, /version). Plain node:http: an
 * engine streams one small write per token per request, and every layer in
 * between would be paid per token.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Logger } from "../common/log.ts";
import { usageModeOf } from "../common/usage-mode.ts";
import { Secrets, UNAUTHORIZED_BODY, UNAUTHORIZED_STATUS, vllmAuthorized } from "./api-key.ts";
import { EMBEDDING_DIM, embeddingVector, float32Base64 } from "./embeddings.ts";
import type { EngineCore } from "./engine-core.ts";
import type { FaultPlan } from "./faults.ts";
import { Generation, type GenerationSpec } from "./generation.ts";
import { renderMetrics } from "./metrics.ts";
import type { Persona } from "./persona.ts";
import {
  ApiError,
  ChatRequest,
  CompletionRequest,
  EmbeddingRequest,
  embeddingInputs,
  embeddingsBody,
  errorBody,
  JSON_HEADERS,
  modelsBody,
  SSE_HEADERS,
  usageJson,
  zodToApiError,
} from "./protocol.ts";
import { fastApiErrorBody, type Quirks, streamedUsageMode } from "./quirks.ts";
import { chatPlan, completionPlan, type RequestPlan, responsesPlan } from "./request-plan.ts";
import { type Arrival, type RequestTrace, TraceSpan, wallMs } from "./request-trace.ts";
import { ResponsesRequest, ResponseWriter } from "./responses.ts";
import type { Runner } from "./runner.ts";
import type { SeqEvent } from "./scheduler.ts";
import { completionPromptTokens, fnv1a } from "./text.ts";

export const MAX_BODY_BYTES = 32 * 1024 * 1024;
export const CRASH_EXIT_CODE = 70;

export interface ServerOptions {
  rootModel: string;
  servedModelNames: string[];
  maxModelLen: number;
  seed: number;
  outputLen: number;
  promptTokensDetails: boolean;
  /** `--enable-auto-tool-choice` with a `--tool-call-parser`: `tool_choice: "auto"` is served. */
  autoToolChoice?: boolean;
  /**
   * `--api-key` or `VLLM_API_KEY`: what a `/v1` request must bear, by vLLM's
   * rule (api-key.ts). A persona checks its own engine's key instead.
   */
  apiKeys?: readonly string[];
  faults: FaultPlan;
  runner: Runner;
  log: Logger;
  /** `--sim-trace`: a line per generation request. */
  trace?: RequestTrace;
  /** Exits the process; replaceable so a crash is observable without dying in unit tests. */
  crash?: () => void;
  /** `--sim-quirks`: how this engine differs from vLLM. */
  quirks?: Quirks;
  /** How long an idle connection stays open (flags.ts, KEEP_ALIVE_ENV); 65 s when not given. */
  keepAliveMs?: number;
  /** Another engine to play than vLLM (persona.ts). */
  persona?: Persona;
}

/** What generate() reads of a request besides its plan. */
type GenerationParams = Pick<ChatRequest, "stream" | "stop" | "stream_options" | "cache_salt" | "user">;

/** A Responses request's defaults for what its response object echoes, as vLLM's sampling defaults. */
const DEFAULT_TEMPERATURE = 1;
const DEFAULT_TOP_P = 1;

export class SimServer {
  private readonly opts: ServerOptions;
  readonly http: Server;
  private ready = false;
  private readonly created = Math.floor(Date.now() / 1000);
  private readonly startTime = Date.now() / 1000;
  /** Hung requests are kept here so nothing collects their sockets. */
  private readonly hung = new Set<ServerResponse>();
  private readonly orcaFormat = new WeakMap<ServerResponse, "text" | "json">();
  private readonly arrivals = new WeakMap<ServerResponse, Arrival>();
  /** Each accepted connection's number, for the trace. */
  private readonly connections = new WeakMap<object, number>();
  private accepted = 0;
  private readonly quirks: Quirks;
  private readonly persona: Persona | undefined;
  private readonly apiKeys: Secrets;

  constructor(opts: ServerOptions) {
    this.opts = opts;
    this.apiKeys = new Secrets(opts.persona ? [] : (opts.apiKeys ?? []));
    this.quirks = opts.quirks ?? new Set();
    this.persona = opts.persona;
    // No buffer past the keep-alive: uvicorn closes at its timeout exactly,
    // where Node 24 would wait a second more by default.
    const keepAlive = { keepAliveTimeout: opts.keepAliveMs ?? 65_000, keepAliveTimeoutBuffer: 0 };
    this.http = createServer({ ...keepAlive, requestTimeout: 0 }, (req, res) => {
      // A client that vanished mid-write must cost an aborted request, never the process.
      res.on("error", () => {});
      req.on("error", () => {});
      // Taken before anything else runs for this request, so the trace's
      // arrival is when the engine could first have seen it.
      if (opts.trace) {
        const rid = req.headers["x-request-id"];
        this.arrivals.set(res, {
          at: wallMs(),
          requestId: typeof rid === "string" ? rid : null,
          connection: this.connections.get(req.socket) ?? 0,
        });
      }
      this.route(req, res).catch((err) => this.fail(res, err));
    });
    if (opts.trace) this.http.on("connection", (socket) => this.connections.set(socket, ++this.accepted));
  }

  markReady(): void {
    this.ready = true;
  }

  get isReady(): boolean {
    return this.ready;
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0]!;
    const method = req.method ?? "GET";
    if (this.persona && (await this.persona.route(req, res, path, method))) return;
    // vLLM's middleware comes before any route: a /v1 path it does not have gets the 401 too, not a 404.
    if (!vllmAuthorized(this.apiKeys, path, method, req.headers.authorization)) {
      req.resume();
      return this.sendText(res, UNAUTHORIZED_STATUS, UNAUTHORIZED_BODY, "application/json");
    }
    if (path === "/health") {
      req.resume();
      res.writeHead(this.ready ? 200 : 503, { "content-length": "0" }).end();
      return;
    }
    if (path === "/metrics" && method === "GET") {
      req.resume();
      return this.sendText(res, 200, this.metricsText(), "text/plain; version=0.0.4; charset=utf-8");
    }
    if (path === "/ping" && (method === "GET" || method === "POST")) {
      req.resume();
      res.writeHead(this.ready ? 200 : 503, { "content-length": "0" }).end();
      return;
    }
    if (path === "/version" && method === "GET") {
      req.resume();
      return this.sendText(res, 200, '{"version":"0.0.0+llmgw-sim"}', "application/json");
    }
    const inference =
      path === "/v1/chat/completions" ||
      path === "/v1/completions" ||
      path === "/v1/responses" ||
      path === "/v1/embeddings";
    if (!inference && path !== "/v1/models") {
      req.resume();
      throw new ApiError(404, `Not Found: ${method} ${path}`);
    }
    if (!this.ready) {
      req.resume();
      throw new ApiError(503, "The server is starting up; retry shortly.");
    }
    if (path === "/v1/models") {
      req.resume();
      if (method !== "GET") throw new ApiError(405, "Method Not Allowed");
      const o = this.opts;
      return this.sendText(
        res,
        200,
        modelsBody(o.servedModelNames, o.rootModel, o.maxModelLen, this.created),
        "application/json",
      );
    }
    if (method !== "POST") {
      req.resume();
      throw new ApiError(405, "Method Not Allowed");
    }
    const body = await readJson(req);
    const orca = String(req.headers["endpoint-load-metrics-format"] ?? "").toLowerCase();
    if (orca === "text" || orca === "json") this.orcaFormat.set(res, orca);
    if (path === "/v1/chat/completions") return this.chat(body, res);
    if (path === "/v1/embeddings") return this.embeddings(body, res);
    if (path === "/v1/responses") return this.responses(body, res);
    return this.completions(body, res);
  }

  private chat(body: unknown, res: ServerResponse): void {
    const parsed = ChatRequest.safeParse(body);
    if (!parsed.success) throw zodToApiError(parsed.error);
    const r = parsed.data;
    const model = this.checkModel(r.model);
    // The tools as the client wrote them: what a chat template would render.
    const toolsJson = r.tools?.length ? JSON.stringify((body as { tools: unknown }).tools) : undefined;
    this.generate("chat", model, chatPlan(r, toolsJson, this.opts), r, res);
  }

  private completions(body: unknown, res: ServerResponse): void {
    const parsed = CompletionRequest.safeParse(body);
    if (!parsed.success) throw zodToApiError(parsed.error);
    const r = parsed.data;
    const model = this.checkModel(r.model);
    const plan = completionPlan(r, this.opts);
    this.generate(
      "completion",
      model,
      { ...plan, maxTokens: plan.maxTokens ?? this.persona?.defaultMaxTokens("completion") },
      r,
      res,
    );
  }

  /** OpenAI's Responses API: chat underneath (responses.ts), with its own bodies and events. */
  private responses(body: unknown, res: ServerResponse): void {
    const parsed = ResponsesRequest.safeParse(body);
    if (!parsed.success) throw zodToApiError(parsed.error);
    const r = parsed.data;
    const model = this.checkModel(r.model);
    const plan = responsesPlan(r, this.opts);
    this.generate(
      "response",
      model,
      plan,
      { stream: r.stream, cache_salt: r.cache_salt, user: r.user },
      res,
      {
        instructions: r.instructions ?? null,
        maxOutputTokens: r.max_output_tokens ?? null,
        temperature: r.temperature ?? DEFAULT_TEMPERATURE,
        topP: r.top_p ?? DEFAULT_TOP_P,
      },
    );
  }

  /**
   * vLLM's pooling path: every input is its own engine sequence, prefill only
   * (it shares the batch, the KV cache and the prefix cache with generation,
   * and its prompt tokens are counted when its prefill is done); the answer
   * goes out when the last one is. The fault flags do not apply (they are
   * about generation requests); a client that leaves aborts what is left.
   */
  private embeddings(body: unknown, res: ServerResponse): void {
    const parsed = EmbeddingRequest.safeParse(body);
    if (!parsed.success) throw zodToApiError(parsed.error);
    const r = parsed.data;
    const model = this.checkModel(r.model);
    const dimensions = r.dimensions ?? EMBEDDING_DIM;
    if (dimensions > EMBEDDING_DIM) {
      throw new ApiError(
        400,
        `dimensions: this model's embeddings have ${EMBEDDING_DIM} dimensions; ask for at most ${EMBEDDING_DIM}`,
        "dimensions",
      );
    }
    const prompts = embeddingInputs(r.input).map((input) => completionPromptTokens(input));
    const limit = this.opts.maxModelLen;
    for (const ids of prompts) {
      if (ids.length > limit) {
        throw new ApiError(
          400,
          `This model's maximum context length is ${limit} tokens. However, you requested ${ids.length} tokens in the input for embedding generation. Please reduce the length of the input.`,
          "input",
        );
      }
    }
    const base64 = r.encoding_format === "base64";
    const runner = this.opts.runner;
    const id = `embd-${randomUUID().replace(/-/g, "")}`;
    const created = Math.floor(Date.now() / 1000);
    const arrival = runner.simNow();
    const rendered: string[] = new Array(prompts.length);
    const pending = new Set<string>();
    let promptTokens = 0;
    for (const ids of prompts) promptTokens += ids.length;
    let done = false;
    res.on("close", () => {
      if (done) return;
      done = true;
      for (const seqId of pending) runner.cancel(seqId, "abort");
      pending.clear();
    });
    const sinkFor = (i: number) => ({
      onEvent: (ev: SeqEvent) => {
        if (done || ev.kind !== "pooled") return;
        const seqId = ev.seq.spec.id;
        pending.delete(seqId);
        const v = embeddingVector(prompts[i]!, dimensions);
        rendered[i] = base64 ? `"${float32Base64(v)}"` : `[${v.join(",")}]`;
        if (pending.size > 0) return;
        done = true;
        const json = this.persona
          ? this.persona.embeddingsBody(model, rendered, promptTokens)
          : embeddingsBody(
              id,
              created,
              model,
              rendered,
              usageJson({ prompt: promptTokens, completion: 0 }, false),
            );
        res.writeHead(200, {
          ...JSON_HEADERS,
          "content-length": Buffer.byteLength(json),
          "x-llmgw-sim-arrival": arrival.toFixed(6),
          ...this.loadHeader(res),
        });
        res.end(json);
      },
    });
    const specs = prompts.map((promptIds, i) => ({ id: `${id}-${i}`, promptIds }));
    for (const s of specs) pending.add(s.id);
    specs.forEach((s, i) => {
      runner.submit(
        { ...s, pooling: true, maxTokens: 0, naturalLength: 0, nextToken: () => 0 },
        sinkFor(i),
        arrival,
      );
    });
  }

  private checkModel(model: string | null | undefined): string {
    if (this.persona) return this.persona.model(model);
    const names = this.opts.servedModelNames;
    if (model === undefined || model === null || model === "") return names[0]!;
    if (this.quirks.has("pinned-model")) return names[0]!;
    if (!names.includes(model)) throw new ApiError(404, `The model \`${model}\` does not exist.`, "model");
    return model;
  }

  /**
   * The output limit of a request whose prompt is `prompt` tokens long, or
   * vLLM's 400 when it does not fit. Chat and completions refuse a
   * `max_tokens` past the context; vLLM's Responses API cuts
   * `max_output_tokens` to what is left (its get_max_tokens) and refuses
   * only a prompt that fills the context, with a message of its own.
   */
  private outputLimit(kind: GenerationSpec["kind"], prompt: number, asked: number | undefined): number {
    if (this.persona) return this.persona.outputLimit(kind, prompt, asked);
    const limit = this.opts.maxModelLen;
    if (kind === "response") {
      if (prompt >= limit) {
        throw new ApiError(
          400,
          `The engine prompt length ${prompt} exceeds the max_model_len ${limit}. Please reduce prompt.`,
          "input",
        );
      }
      return Math.min(asked ?? limit, limit - prompt);
    }
    if (prompt >= limit || (asked !== undefined && prompt + asked > limit)) {
      const n = asked ?? 1;
      throw new ApiError(
        400,
        `This model's maximum context length is ${limit} tokens. However, you requested ${prompt + n} tokens (${prompt} in the messages, ${n} in the completion). Please reduce the length of the messages or completion.`,
        asked !== undefined && prompt < limit ? "max_tokens" : "messages",
      );
    }
    return asked ?? limit - prompt;
  }

  private generate(
    kind: GenerationSpec["kind"],
    model: string,
    plan: RequestPlan,
    r: GenerationParams,
    res: ServerResponse,
    response?: GenerationSpec["response"],
  ): void {
    const o = this.opts;
    const { promptIds } = plan;
    const maxTokens = this.outputLimit(kind, promptIds.length, plan.maxTokens);
    const fate = o.faults.next();
    if (fate === "fail") throw new ApiError(500, "Simulated engine failure (--sim-fail-rate)");

    const stream = r.stream === true;
    const id = this.persona?.newId(kind) ?? vllmId(kind);
    const created = Math.floor(Date.now() / 1000);
    if (fate === "hang-first-token") {
      if (stream) {
        res.writeHead(200, { ...SSE_HEADERS, ...this.loadHeader(res) });
        res.flushHeaders();
        // vLLM's API server sends these itself, before it waits on the engine (no item yet, so no item id).
        if (response)
          res.write(new ResponseWriter({ ...response, id, itemId: "", created, model }).opening());
      }
      this.hang(res);
      return;
    }

    const arrived = this.arrivals.get(res);
    const span = o.trace && arrived ? new TraceSpan(o.trace, id, r.user ?? null, arrived) : undefined;
    const runner = o.runner;
    // When the engine took the request, in simulated seconds: lets a benchmark replay the exact arrivals.
    const arrival = runner.simNow();
    const simHeaders = { "x-llmgw-sim-arrival": arrival.toFixed(6) };
    const generation = new Generation(
      {
        kind,
        id,
        created,
        model,
        promptIds,
        plans: plan.choices,
        maxTokens,
        stops:
          r.stop === undefined || r.stop === null
            ? []
            : (typeof r.stop === "string" ? [r.stop] : r.stop).filter((s) => s !== ""),
        stream,
        ...this.streamUsage(kind, stream, r.stream_options),
        ...(kind === "response" ? { response } : { quirks: this.quirks }),
        ...this.personaSpec(),
        logprobs: plan.logprobs,
        ...(r.cache_salt ? { cacheSalt: fnv1a(r.cache_salt) } : {}),
        promptTokensDetails: o.promptTokensDetails,
        fate,
      },
      {
        runner,
        res,
        span,
        headers: () => ({ ...simHeaders, ...this.loadHeader(res) }),
        crash: () => this.crash(),
        hang: (h) => this.hang(h),
        ...(this.persona?.observer ? { observer: this.persona.observer } : {}),
      },
    );
    generation.start(arrival);
  }

  /** How much usage a stream carries: the persona's reading of `stream_options`, or vLLM's with the quirks. */
  private streamUsage(
    kind: GenerationSpec["kind"],
    stream: boolean,
    opts: GenerationParams["stream_options"],
  ): Pick<GenerationSpec, "usageMode" | "finalUsage"> {
    // A response streams as vLLM's whatever the persona or quirks: usage rides on response.completed.
    if (!stream || kind === "response") return { usageMode: "none" };
    if (!this.persona) return { usageMode: streamedUsageMode(usageModeOf(opts), this.quirks) };
    const u = this.persona.usage(opts);
    return { usageMode: u.mode, finalUsage: u.final };
  }

  private personaSpec(): Pick<GenerationSpec, "wire" | "eosTokenId"> {
    const p = this.persona;
    if (!p) return {};
    return { wire: p.wire, ...(p.eosTokenId !== undefined ? { eosTokenId: p.eosTokenId } : {}) };
  }

  /**
   * vLLM's ORCA load report: with request header `endpoint-load-metrics-format: TEXT|JSON`
   * the response carries `endpoint-load-metrics` (KV usage and queue length at that moment),
   * so a router gets live load with every answer instead of waiting for a scrape.
   */
  private loadHeader(res: ServerResponse): Record<string, string> {
    const format = this.orcaFormat.get(res);
    // ORCA load reports are vLLM's; another persona sends none.
    if (!format || this.persona) return {};
    const cores = this.opts.runner.cores;
    let waiting = 0;
    let kv = 0;
    for (const c of cores) {
      const g = c.gauges();
      waiting += g.waiting;
      kv += g.kvUsage / cores.length;
    }
    const f = (v: number) => (Number.isInteger(v) ? `${v}.0` : String(v));
    const value =
      format === "text"
        ? `TEXT named_metrics.kv_cache_usage_perc=${f(kv)}, named_metrics.num_requests_waiting=${f(waiting)}`
        : `JSON {"named_metrics": {"kv_cache_usage_perc": ${f(kv)}, "num_requests_waiting": ${f(waiting)}}}`;
    return { "endpoint-load-metrics": value };
  }

  private crash(): void {
    this.opts.log.error("simulated crash (--sim-crash-after): exiting", { code: CRASH_EXIT_CODE });
    if (this.opts.crash) this.opts.crash();
    else process.exit(CRASH_EXIT_CODE);
  }

  private hang(res: ServerResponse): void {
    this.hung.add(res);
    res.on("close", () => this.hung.delete(res));
  }

  private metricsText(): string {
    const cores: EngineCore[] = this.opts.runner.cores;
    const cpu = process.cpuUsage();
    return renderMetrics(
      this.opts.servedModelNames[0]!,
      cores.map((c) => ({ metrics: c.metrics, gauges: c.gauges() })),
      {
        cpuSeconds: (cpu.user + cpu.system) / 1e6,
        residentBytes: process.memoryUsage.rss(),
        startTimeSeconds: this.startTime,
        simLagSeconds: this.opts.runner.lagSeconds,
      },
    );
  }

  private sendText(res: ServerResponse, status: number, body: string, type: string): void {
    res.writeHead(status, { "content-type": type, "content-length": Buffer.byteLength(body) });
    res.end(body);
  }

  private fail(res: ServerResponse, err: unknown): void {
    const e =
      err instanceof ApiError
        ? err
        : new ApiError(500, `internal error: ${err instanceof Error ? err.message : String(err)}`);
    if (e.status >= 500 && !(err instanceof ApiError))
      this.opts.log.error("request failed", { err: e.message });
    if (res.headersSent) {
      // Headers are gone: say it the way vLLM does mid-stream, then close.
      if (!res.writableEnded) {
        res.end(
          this.persona
            ? this.persona.streamErrorTail(e)
            : `data: ${errorBody(e)}\n\n${this.quirks.has("no-done") ? "" : "data: [DONE]\n\n"}`,
        );
      }
      return;
    }
    const body = this.persona
      ? this.persona.errorBody(e)
      : this.quirks.has("fastapi-errors")
        ? fastApiErrorBody(e.status, e.message, e.param)
        : errorBody(e);
    res.writeHead(e.status, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
    });
    res.end(body);
  }
}

/** vLLM's ids: `chatcmpl-`, `cmpl-` or `resp_` and 32 hex digits. */
function vllmId(kind: GenerationSpec["kind"]): string {
  const hex = randomUUID().replace(/-/g, "");
  return kind === "response" ? `resp_${hex}` : `${kind === "chat" ? "chatcmpl" : "cmpl"}-${hex}`;
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > MAX_BODY_BYTES) {
    req.resume();
    throw new ApiError(413, `request body over ${MAX_BODY_BYTES} bytes`);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > MAX_BODY_BYTES) throw new ApiError(413, `request body over ${MAX_BODY_BYTES} bytes`);
    chunks.push(c);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  try {
    return JSON.parse(text);
  } catch (err) {
    const e = new ApiError(400, `invalid JSON body: ${err instanceof Error ? err.message : String(err)}`);
    e.validation = true;
    throw e;
  }
}
