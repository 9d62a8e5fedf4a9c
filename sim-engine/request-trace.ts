/**
 * `--sim-trace FILE`: one JSON line per generation request, with the wall
 * clock (ms since the epoch, sub-ms precision) at three instants: when its
 * HTTP request reached the engine, when its first token was written, and
 * when it ended. Set beside a client's own send and receive times, these
 * split a TTFT measured through a gateway into the time before the engine
 * had the request, the engine's own share, and the time after it wrote the
 * first token; the client's figure alone cannot tell them apart, and the
 * engine's share moves with where an arrival falls in the batch's step.
 * vLLM reports the same instants as OpenTelemetry spans
 * (--otlp-traces-endpoint); a file keeps the sim free of a collector.
 *
 * Records are matched to a client's requests by `user` (OpenAI's end-user
 * field, which gateways pass through) or by the `x-request-id` header.
 */
import { createWriteStream, openSync, readFileSync, type WriteStream } from "node:fs";

export interface TraceRecord {
  /** The engine's response id (chatcmpl-…, cmpl-…, resp_…). */
  id: string;
  user: string | null;
  request_id: string | null;
  /**
   * Which of the engine's HTTP connections carried it, numbered from 1 in
   * the order they were accepted: a client that keeps its connections
   * alive sends many requests on one.
   */
  connection: number;
  arrived_ms: number;
  /** Null when the request ended before its first token. */
  first_token_ms: number | null;
  ended_ms: number;
  outcome: "finished" | "aborted";
  prompt_tokens: number;
  completion_tokens: number;
}

/** A trace file's records by their `user` tag (records without one are left out). */
export function readTrace(file: string): Map<string, TraceRecord> {
  const byUser = new Map<string, TraceRecord>();
  const lines = readFileSync(file, "utf8").split("\n");
  // A last line without its newline is a record the engine was writing when it stopped.
  lines.pop();
  lines.forEach((line, i) => {
    if (!line) return;
    let r: TraceRecord;
    try {
      r = JSON.parse(line) as TraceRecord;
    } catch (err) {
      throw new Error(`${file}:${i + 1}: not a trace record: ${(err as Error).message}`);
    }
    if (r.user !== null) byUser.set(r.user, r);
  });
  return byUser;
}

/** Wall-clock ms with the monotonic clock's resolution, comparable across processes on one host. */
export function wallMs(): number {
  return performance.timeOrigin + performance.now();
}

export class RequestTrace {
  private readonly out: WriteStream;

  /** Opens `path` for appending at once, so a bad path fails at startup, not at the first request. */
  constructor(path: string, onError: (err: Error) => void) {
    // Buffered and asynchronous: a line per request must not put a
    // synchronous disk write on the event loop that times every token.
    this.out = createWriteStream(path, { fd: openSync(path, "a") });
    this.out.on("error", onError);
  }

  write(r: TraceRecord): void {
    // Requests cut off by shutdown may end after close(); their lines are dropped.
    if (!this.out.writableEnded) this.out.write(`${JSON.stringify(r)}\n`);
  }

  /** Resolves once every line written so far is on disk. */
  close(): Promise<void> {
    return new Promise((resolve) => this.out.end(resolve));
  }
}

/** What the server knows of a request before its body is read. */
export interface Arrival {
  at: number;
  requestId: string | null;
  connection: number;
}

/** One request's record, written once, on whichever of finish or abort comes first. */
export class TraceSpan {
  private firstToken: number | null = null;
  private ended = false;

  constructor(
    private readonly trace: RequestTrace,
    private readonly id: string,
    private readonly user: string | null,
    private readonly arrival: Arrival,
  ) {}

  token(): void {
    if (this.firstToken === null) this.firstToken = wallMs();
  }

  end(outcome: TraceRecord["outcome"], promptTokens: number, completionTokens: number): void {
    if (this.ended) return;
    this.ended = true;
    this.trace.write({
      id: this.id,
      user: this.user,
      request_id: this.arrival.requestId,
      connection: this.arrival.connection,
      arrived_ms: this.arrival.at,
      first_token_ms: this.firstToken,
      ended_ms: wallMs(),
      outcome,
      prompt_tokens: promptTokens,
      completion_tokens: completionTokens,
    });
  }
}
