/**
 * One chat, completion or Responses request in flight: its `n` choices, each an
 * engine sequence of its own (as vLLM forks `n > 1` into child requests
 * that share the prompt through the prefix cache), what each writes, and
 * the end of the response once every choice has ended.
 *
 * Usage follows vLLM: `prompt_tokens` once per request, `completion_tokens`
 * the sum over choices; with continuous usage stats each token chunk
 * carries its own choice's count (vLLM's `previous_num_tokens[i]`), and the
 * final usage chunk the sum. Every token the engine counts is written in a
 * chunk of its own, so the engine's counters always equal the usage written.
 */
import { randomUUID } from "node:crypto";
import type { ServerResponse } from "node:http";
import type { UsageMode } from "../common/usage-mode.ts";
import type { ChoicePlan } from "./choice-plan.ts";
import type { Fate } from "./faults.ts";
import { stepLogprobs } from "./logprobs.ts";
import {
  chatLogprob,
  chatLogprobs,
  completionLogprobs,
  JSON_HEADERS,
  SSE_HEADERS,
  toolCallJson,
} from "./protocol.ts";
import type { Quirks } from "./quirks.ts";
import type { TraceSpan } from "./request-trace.ts";
import { type ResponseEcho, ResponseWriter } from "./responses.ts";
import type { Runner } from "./runner.ts";
import type { SeqEvent, SeqGroup } from "./scheduler.ts";
import { type ChoiceEnd, type StreamWriter, type UsagePlace, VLLM_WIRE, type Wire } from "./wire.ts";

export interface GenerationSpec {
  kind: "chat" | "completion" | "response";
  /** The response id (chatcmpl-…, cmpl-…, resp_…). */
  id: string;
  created: number;
  model: string;
  promptIds: number[];
  /** One per choice. */
  plans: ChoicePlan[];
  /** Per choice: max_tokens, or what fits the context. */
  maxTokens: number;
  stops: string[];
  stream: boolean;
  usageMode: UsageMode;
  /** `logprobs` asked: how many alternatives per token, and whether sampling is greedy. */
  logprobs: { top: number; greedy: boolean } | null;
  cacheSalt?: number;
  promptTokensDetails: boolean;
  fate: Exclude<Fate, "fail" | "hang-first-token">;
  /** `--sim-quirks`: how this engine's streams differ from vLLM's. */
  quirks?: Quirks;
  /** Kind "response": what the response object repeats of the request (one choice, text only). */
  response?: Omit<ResponseEcho, "id" | "created" | "model" | "itemId">;
  /** How chunks and bodies look on the wire; vLLM's when not given. */
  wire?: Wire;
  /**
   * Whether a stream ends with a usage chunk. Left out, it follows
   * `usageMode` (vLLM: continuous stats only come with include_usage); SGLang
   * reads the two stream options apart.
   */
  finalUsage?: boolean;
  /** What a choice that ended by itself reports as its `matched_stop` (the EOS token id). */
  eosTokenId?: number;
}

/**
 * Told of every choice's timing and end, for an engine whose counters move
 * per finished request rather than per token (SGLang's tokenizer metrics).
 * Times are simulated seconds.
 */
export interface RequestObserver {
  firstToken(seconds: number): void;
  interToken(seconds: number): void;
  /** A choice that ran to its end: its request's prompt, its own output, the cached prompt tokens. */
  finished(prompt: number, completion: number, cached: number, e2eSeconds: number): void;
  /** A choice cut short (client gone, crash, hang): nothing of it is counted. */
  aborted(): void;
}

export interface GenerationIo {
  runner: Runner;
  res: ServerResponse;
  span: TraceSpan | undefined;
  /** Headers for the response head, taken when it is sent (the ORCA load report is live). */
  headers(): Record<string, string | number>;
  crash(): void;
  hang(res: ServerResponse): void;
  observer?: RequestObserver;
}

interface Choice {
  index: number;
  plan: ChoicePlan;
  seqId: string;
  toolCallId: string | undefined;
  /** The output so far, cut at a stop string: content, a completion's text, or a call's arguments. */
  text: string;
  /** Code points of `text`, for completions' `text_offset`. */
  codePoints: number;
  generated: number;
  finish: string | null;
  /** What stopped it (ChoiceEnd.matched), once it finished. */
  matched: string | number | null;
  /** Once ended, nothing more is written for it (finished, or stopped by a fault). */
  ended: boolean;
  logprobs: string[];
  steps: { step: ReturnType<typeof stepLogprobs>; offset: number }[];
}

export class Generation {
  private readonly spec: GenerationSpec;
  private readonly io: GenerationIo;
  private readonly wire: Wire;
  private readonly writer: StreamWriter;
  private readonly choices: Choice[];
  private readonly chat: boolean;
  /** Set for the Responses API, whose bodies and events replace chat's chunks. */
  private readonly response: ResponseWriter | undefined;
  /** The response ended, or the client left: events are dropped. */
  private done = false;
  private started = false;
  private cached = 0;
  private open: number;
  private arrival = 0;

  constructor(spec: GenerationSpec, io: GenerationIo) {
    this.spec = spec;
    this.io = io;
    this.chat = spec.kind === "chat";
    this.response = spec.response
      ? new ResponseWriter({
          ...spec.response,
          id: spec.id,
          itemId: `msg_${randomUUID().replace(/-/g, "")}`,
          created: spec.created,
          model: spec.model,
        })
      : undefined;
    this.wire = spec.wire ?? VLLM_WIRE;
    this.writer = this.wire.stream(this.chat, spec.id, spec.created, spec.model, spec.usageMode);
    this.choices = spec.plans.map((plan, index) => ({
      index,
      plan,
      seqId: `${spec.id}-${index}`,
      toolCallId: plan.toolName ? `chatcmpl-tool-${randomUUID().replace(/-/g, "")}` : undefined,
      text: "",
      codePoints: 0,
      generated: 0,
      finish: null,
      matched: null,
      ended: false,
      logprobs: [],
      steps: [],
    }));
    this.open = this.choices.length;
  }

  /** Sends the head (streams, and a request fated to crash), then hands the choices to the engine. */
  start(arrival: number): void {
    const { spec, io } = this;
    this.arrival = arrival;
    const res = io.res;
    if (spec.stream || spec.fate === "crash") {
      res.writeHead(200, { ...(spec.stream ? SSE_HEADERS : JSON_HEADERS), ...io.headers() });
      res.flushHeaders();
      // vLLM sends these before it awaits the engine's first output.
      if (spec.stream && this.response) res.write(this.response.opening());
    }
    res.on("close", () => {
      // A no-op after finish: the span was already written.
      io.span?.end("aborted", spec.promptIds.length, this.completionTokens());
      this.abandon();
    });
    const group: SeqGroup = { promptCounted: false };
    io.runner.submitGroup(
      this.choices.map((c) => ({
        spec: {
          id: c.seqId,
          promptIds: spec.promptIds,
          maxTokens: spec.maxTokens,
          naturalLength: c.plan.naturalLength,
          nextToken: c.plan.tokenAt,
          group,
          ...(spec.cacheSalt !== undefined ? { cacheSalt: spec.cacheSalt } : {}),
        },
        sink: { onEvent: (ev: SeqEvent) => this.onEvent(c, ev) },
      })),
      arrival,
    );
  }

  private completionTokens(): number {
    let sum = 0;
    for (const c of this.choices) sum += c.generated;
    return sum;
  }

  /** The total rides on the last finish chunk instead of a `choices: []` chunk of its own. */
  private usageOnFinish(): boolean {
    return this.spec.usageMode !== "none" && this.spec.quirks?.has("usage-on-finish") === true;
  }

  private usage(completion: number, place: UsagePlace): string {
    const { spec } = this;
    return this.writer.usageJson(
      { prompt: spec.promptIds.length, completion, cached: this.cached },
      spec.promptTokensDetails,
      place,
    );
  }

  /** Whether the stream ends with a `choices: []` usage chunk. */
  private finalUsageChunk(): boolean {
    const { spec } = this;
    return (spec.finalUsage ?? spec.usageMode !== "none") && !this.usageOnFinish();
  }

  /** Stops every choice still in the engine; what they already wrote stays counted. */
  private abandon(): void {
    if (this.done) return;
    this.done = true;
    for (const c of this.choices) {
      if (c.ended) continue;
      c.ended = true;
      this.io.runner.cancel(c.seqId, "abort");
      this.io.observer?.aborted();
    }
  }

  private onEvent(c: Choice, ev: SeqEvent): void {
    if (this.done || ev.kind !== "token" || c.ended) return;
    const { spec, io } = this;
    const first = !this.started;
    if (first) {
      this.started = true;
      // The choice whose first token came first counted the prompt (engine-core.ts).
      this.cached = ev.seq.cachedPromptTokens;
      io.span?.token();
    }
    this.observe(ev);
    const full = c.plan.pieceAt(ev.index, ev.token);
    const piece = this.append(c, ev, full);
    c.generated = ev.index + 1;
    if (c.finish !== null) {
      c.ended = true;
      this.open--;
      if (spec.fate === "normal") {
        io.observer?.finished(
          spec.promptIds.length,
          c.generated,
          ev.seq.cachedPromptTokens,
          ev.at - this.arrival,
        );
      }
    }

    let lp: string | null = null;
    if (spec.logprobs) {
      const step = stepLogprobs(c.plan.seed, ev.index, full, spec.logprobs.top, spec.logprobs.greedy);
      if (this.chat) {
        const entry = chatLogprob(step);
        if (spec.stream) lp = chatLogprobs([entry]);
        else c.logprobs.push(entry);
      } else {
        const at = { step, offset: c.codePoints };
        if (spec.stream) lp = completionLogprobs([at]);
        else c.steps.push(at);
      }
      c.codePoints += [...piece].length;
    }

    if (spec.fate === "crash") {
      this.abandon();
      if (spec.stream) io.res.write(this.chunk(c, piece, lp, first), () => io.crash());
      else io.crash();
      return;
    }
    if (spec.fate === "hang-mid-stream") {
      // One token per choice, then silence: each choice stops at its first
      // token, so every token the engine counted was written.
      if (!c.ended) {
        c.ended = true;
        io.runner.cancel(c.seqId, "abort");
        io.observer?.aborted();
      }
      if (spec.stream) io.res.write(this.chunk(c, piece, lp, first));
      if (first) io.hang(io.res);
      return;
    }
    if (spec.stream) io.res.write(this.chunk(c, piece, lp, first));
    if (this.open === 0) this.finish();
  }

  private observe(ev: Extract<SeqEvent, { kind: "token" }>): void {
    const o = this.io.observer;
    if (!o) return;
    if (ev.index === 0) o.firstToken(ev.at - this.arrival);
    else if (ev.prevAt !== undefined) o.interToken(ev.at - ev.prevAt);
  }

  /**
   * Adds a token's text to choice `c`, cut before the first stop string, and
   * returns what of it is written; sets the choice's finish and matched stop
   * when this token ended it.
   */
  private append(c: Choice, ev: Extract<SeqEvent, { kind: "token" }>, full: string): string {
    const { spec, io } = this;
    let piece = full;
    let reason: string | null = ev.finished ?? null;
    let matched: string | number | null = reason === "stop" ? (spec.eosTokenId ?? null) : null;
    if (spec.stops.length > 0) {
      const before = c.text.length;
      const joined = c.text + piece;
      let cut = -1;
      for (const s of spec.stops) {
        const at = joined.indexOf(s, Math.max(0, before - s.length + 1));
        if (at >= 0 && (cut < 0 || at < cut)) {
          cut = at;
          matched = s;
        }
      }
      if (cut >= 0) {
        piece = joined.slice(before, Math.max(before, cut));
        c.text = joined.slice(0, cut);
        if (!ev.finished) io.runner.cancel(c.seqId, "stop");
        reason = "stop";
      } else c.text = joined;
    } else c.text += piece;
    if (reason !== null) {
      c.finish = c.plan.toolName && reason !== "length" ? "tool_calls" : reason;
      c.matched = reason === "length" ? null : matched;
    }
    return piece;
  }

  /** The chunk for choice `c`'s latest token; the request's first also carries every choice's role chunk. */
  private chunk(c: Choice, piece: string, lp: string | null, first: boolean): string {
    if (this.response) return this.response.delta(piece, first);
    const continuous = this.spec.usageMode === "continuous";
    let out = "";
    const w = this.writer;
    if (first && this.chat) {
      const none = continuous ? this.usage(0, "chunk") : null;
      for (const k of this.choices) out += w.role(k.index, none);
    }
    let delta: string;
    if (!this.chat) delta = JSON.stringify(piece);
    else if (c.toolCallId) {
      const head = c.generated === 1 ? { id: c.toolCallId, name: c.plan.toolName! } : null;
      delta = w.toolCall(head, piece);
    } else delta = w.content(piece);
    // vLLM's continuous stats: each chunk counts its own choice's tokens.
    let usage = continuous ? this.usage(c.generated, "chunk") : null;
    if (this.usageOnFinish() && this.open === 0 && c.finish !== null)
      usage = this.usage(this.completionTokens(), "chunk");
    // A chat writer that sends finish_reason in a chunk of its own (SGLang) gets it at the end.
    const finish = !this.chat || w.finishOnToken ? c.finish : null;
    return out + w.token(c.index, delta, lp, finish, usage, c.matched);
  }

  private finish(): void {
    const { spec, io } = this;
    this.done = true;
    const completion = this.completionTokens();
    io.span?.end("finished", spec.promptIds.length, completion);
    if (this.response) {
      this.finishResponse(this.response, completion);
      return;
    }
    const res = io.res;
    const w = this.wire;
    if (spec.stream) {
      const closing = this.chat && !this.writer.finishOnToken ? this.writer.closing(this.ends()) : "";
      const usageChunk = this.finalUsageChunk() ? this.writer.usage(this.usage(completion, "final")) : "";
      res.end(`${closing}${usageChunk}${spec.quirks?.has("no-done") ? "" : w.done}`);
      return;
    }
    const ends = this.ends();
    const choices = this.choices.map((c, i) => {
      const end = ends[i]!;
      if (!this.chat) {
        return w.completionChoice(c.index, c.text, spec.logprobs ? completionLogprobs(c.steps) : null, end);
      }
      const lp = spec.logprobs ? chatLogprobs(c.logprobs) : null;
      if (c.toolCallId) {
        return w.chatChoice(c.index, null, toolCallJson(c.toolCallId, c.plan.toolName!, c.text), lp, end);
      }
      return w.chatChoice(c.index, c.text, "", lp, end);
    });
    const body = spec.quirks?.has("no-usage") ? "null" : this.usage(completion, "body");
    const json = w.body(this.chat, spec.id, spec.created, spec.model, choices, body);
    res.writeHead(200, { ...JSON_HEADERS, "content-length": Buffer.byteLength(json), ...io.headers() });
    res.end(json);
  }

  private ends(): ChoiceEnd[] {
    return this.choices.map((c) => ({ index: c.index, finish: c.finish ?? "stop", matched: c.matched }));
  }

  /** A Responses answer: its closing events, or the whole response object. */
  private finishResponse(writer: ResponseWriter, output: number): void {
    const { spec, io } = this;
    const c = this.choices[0]!;
    const usage = { input: spec.promptIds.length, cached: this.cached, output };
    const finish = c.finish ?? "stop";
    if (spec.stream) {
      io.res.end(writer.closing(c.text, finish, usage));
      return;
    }
    const json = writer.body(c.text, finish, usage);
    io.res.writeHead(200, { ...JSON_HEADERS, "content-length": Buffer.byteLength(json), ...io.headers() });
    io.res.end(json);
  }
}
