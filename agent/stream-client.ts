/**
 * The agent's half of the one stream to the control plane. It dials out and
 * never gives up: a control plane restart must not need anyone to touch a
 * GPU node. Reconnects follow a ReconnectSchedule: back within seconds of
 * the control plane's return, spread at least as widely as the control plane
 * asked (it knows the fleet size), so a fleet does not reconnect in lockstep.
 */
import { create } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { AsyncQueue } from "../common/async-queue.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import {
  type AgentMessage,
  AgentMessageSchema,
  AgentService,
  type ControlMessage,
  type Register,
} from "../proto/gen/agent/v1/agent_pb.ts";
import type { ClientTls } from "./enroll.ts";
import { ReconnectSchedule } from "./reconnect-schedule.ts";
import { tlsHint } from "./tls-hint.ts";

export interface StreamClientOptions {
  url: string;
  log: Logger;
  /** Builds a fresh Register (whole inventory, running shards) per connection. */
  register: () => Promise<Register>;
  onCommand: (msg: ControlMessage) => void;
  onConnected?: (ack: { controlPlaneId: string; epoch: bigint }) => void;
  /** How the control plane wants engines scraped (on register, and when its configuration changes). */
  onScrapeSettings?: (s: { intervalMs: number; timeoutMs: number }) => void;
  /** The control plane refused this agent (a Reject before it ended the stream). */
  onReject?: (reject: { code: string; message: string }) => void;
  /** The first reconnect delay's ceiling (default 1 s). */
  backoffBaseMs?: number;
  /** The ceiling the delay grows to (default 5 s), unless the control plane's spread is wider. */
  backoffMaxMs?: number;
  /** A session that lasted this long resets the backoff. */
  stableAfterMs?: number;
  pingIntervalMs?: number;
  pingTimeoutMs?: number;
  random?: () => number;
  /** mTLS (https:// control planes): the CA to trust and this node's client certificate. */
  tls?: ClientTls;
}

export type StreamState = "connecting" | "connected" | "backoff" | "stopped";

export class StreamClient {
  private readonly schedule: ReconnectSchedule;
  private outbox: AsyncQueue<AgentMessage> | undefined;
  private abort: AbortController | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private stopped = false;
  private readonly stopCtl = new AbortController();
  private spreadMs = 0;
  private loop: Promise<void> | undefined;
  state: StreamState = "connecting";
  private tls: ClientTls | undefined;
  private session: Http2SessionManager | undefined;
  /** Completed registrations over this client's life (1 + reconnects). */
  sessions = 0;
  /** Connection attempts after the first: each follows a lost or refused stream. */
  reconnects = 0;
  /** Messages by direction and type (the oneof case: shardStatus, startShard, …), for /metrics. */
  readonly messages = { sent: new Map<string, number>(), received: new Map<string, number>() };
  lastAckEpoch: bigint | undefined;
  /**
   * When the reconnect schedule meant the current attempt to start, and when
   * it did (Unix ms; 0 before the first wait): the gap is the event loop's
   * lateness, not the schedule's (bench:agents prints both).
   */
  dialDueAt = 0;
  dialedAt = 0;

  constructor(private readonly opts: StreamClientOptions) {
    this.tls = opts.tls;
    this.schedule = new ReconnectSchedule({
      baseMs: opts.backoffBaseMs ?? 1_000,
      maxMs: opts.backoffMaxMs ?? 5_000,
      ...(opts.random ? { random: opts.random } : {}),
    });
  }

  start(): void {
    this.loop ??= this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.state = "stopped";
    this.stopCtl.abort();
    this.abort?.abort();
    this.outbox?.close();
    await this.loop;
    // The HTTP/2 connection, idle now, would keep pinging — and the process
    // alive — until its idle timeout.
    this.session?.abort();
  }

  /** A renewed client certificate: used from the next connection on. */
  setTls(tls: ClientTls): void {
    this.tls = tls;
  }

  /** Queues a message on the live stream; false (dropped) while disconnected. */
  send(msg: AgentMessage): boolean {
    if (this.state !== "connected") return false;
    const pushed = this.outbox?.push(msg) ?? false;
    if (pushed) count(this.messages.sent, msg.msg.case);
    return pushed;
  }

  private client(): Client<typeof AgentService> {
    this.session?.abort();
    this.session = new Http2SessionManager(
      this.opts.url,
      {
        // The server sends no pings, so the client must: a half-dead peer
        // (NAT drop, power loss) is otherwise only noticed when TCP gives up.
        pingIntervalMs: this.opts.pingIntervalMs ?? 10_000,
        pingTimeoutMs: this.opts.pingTimeoutMs ?? 5_000,
        pingIdleConnection: true,
      },
      this.tls ? { ...this.tls } : {},
    );
    const transport = createConnectTransport({
      baseUrl: this.opts.url,
      httpVersion: "2",
      sessionManager: this.session,
    });
    return createClient(AgentService, transport);
  }

  private async run(): Promise<void> {
    // One transport (and HTTP/2 session) across reconnects, a new one only
    // once a renewed certificate is to be presented.
    let client = this.client();
    let clientTls = this.tls;
    const log = this.opts.log;
    while (!this.stopped) {
      if (this.tls !== clientTls) {
        client = this.client();
        clientTls = this.tls;
      }
      this.state = "connecting";
      const started = Date.now();
      this.dialedAt = started;
      let acked = false;
      try {
        const register = await this.opts.register();
        const outbox = new AsyncQueue<AgentMessage>();
        outbox.push(create(AgentMessageSchema, { msg: { case: "register", value: register } }));
        count(this.messages.sent, "register");
        this.outbox = outbox;
        this.abort = new AbortController();
        for await (const msg of client.connect(outbox, { signal: this.abort.signal })) {
          count(this.messages.received, msg.msg.case);
          if (msg.msg.case === "registerAck") {
            acked = true;
            this.sessions++;
            this.state = "connected";
            this.lastAckEpoch = msg.msg.value.epoch;
            this.spreadMs = msg.msg.value.reconnectSpreadMs;
            this.startHeartbeat(msg.msg.value.heartbeatIntervalMs);
            log.info("registered with control plane", {
              controlPlane: msg.msg.value.controlPlaneId,
              epoch: String(msg.msg.value.epoch),
              heartbeatMs: msg.msg.value.heartbeatIntervalMs,
            });
            this.opts.onConnected?.({
              controlPlaneId: msg.msg.value.controlPlaneId,
              epoch: msg.msg.value.epoch,
            });
            if (msg.msg.value.scrape) this.opts.onScrapeSettings?.(msg.msg.value.scrape);
          } else if (msg.msg.case === "settings") {
            this.spreadMs = msg.msg.value.reconnectSpreadMs;
            this.startHeartbeat(msg.msg.value.heartbeatIntervalMs);
            if (msg.msg.value.scrape) this.opts.onScrapeSettings?.(msg.msg.value.scrape);
          } else if (msg.msg.case === "reject") {
            log.error("control plane refused this agent", {
              code: msg.msg.value.code,
              reason: msg.msg.value.message,
            });
            this.opts.onReject?.(msg.msg.value);
          } else {
            this.opts.onCommand(msg);
          }
        }
        if (!this.stopped) log.warn("control plane closed the stream");
      } catch (err) {
        if (this.stopped) break;
        const code = err instanceof ConnectError ? Code[err.code] : undefined;
        const hint = this.tls ? tlsHint(err, this.opts.url) : undefined;
        if (hint) log.error("control plane stream failed", { error: errorMessage(err), code, hint });
        else log.warn("control plane stream failed", { error: errorMessage(err), code });
      } finally {
        this.stopHeartbeat();
        this.outbox?.close();
        this.outbox = undefined;
      }
      if (this.stopped) break;
      if (acked && Date.now() - started >= (this.opts.stableAfterMs ?? 10_000)) this.schedule.reset();
      const delay = this.schedule.next(this.spreadMs);
      this.state = "backoff";
      log.info("reconnecting", { inMs: delay, attempt: this.schedule.attempts });
      this.dialDueAt = Date.now() + delay;
      await sleep(delay, this.stopCtl.signal);
      if (!this.stopped) this.reconnects++;
    }
  }

  private startHeartbeat(intervalMs: number): void {
    this.stopHeartbeat();
    const every = Math.max(100, intervalMs || 5_000);
    this.heartbeat = setInterval(() => {
      this.send(
        create(AgentMessageSchema, {
          msg: { case: "heartbeat", value: { sentAtUnixMs: BigInt(Date.now()) } },
        }),
      );
    }, every);
  }

  private stopHeartbeat(): void {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.heartbeat = undefined;
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(t);
        resolve();
      },
      { once: true },
    );
  });
}

function count(m: Map<string, number>, type: string | undefined): void {
  const t = type ?? "unknown";
  m.set(t, (m.get(t) ?? 0) + 1);
}
