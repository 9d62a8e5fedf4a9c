import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { create } from "@bufbuild/protobuf";
import type { Logger } from "../../common/log.ts";
import {
  type AgentMessage,
  AgentMessageSchema,
  type ControlMessage,
  ControlMessageSchema,
  type ShardLoadReport,
  type ShardStatus,
} from "../../proto/gen/agent/v1/agent_pb.ts";
import type { CertFacts } from "../certificates.ts";
import type { RegistrationInfo, Registry, Transition } from "../registry.ts";
import type { ClaimRefusals } from "./claim-refusals.ts";
import { type BidiCallbacks, type BidiStream, serveConnectBidi } from "./connect-bidi.ts";
import { checkRegister, checkShardLoad, checkShardStatus } from "./register.ts";
import { type StreamCertificates, streamIdentityRefusal } from "./stream-identity.ts";

/** The path connect clients use for AgentService.Connect. */
export const CONNECT_PATH = "/agent.v1.AgentService/Connect";

/**
 * The stream handler. It is also the only thing that can deliver a command
 * to a node, because it holds the open streams: the reconciler dispatches
 * through `send`. What agents say goes to every listener that subscribed
 * (the reconciler for lifecycle, the load board for load).
 */
export interface AgentStreamListener {
  onTransition?(t: Transition): void;
  onRegister?(node: string, shards: ShardStatus[]): void;
  onShardStatus?(node: string, status: ShardStatus): void;
  onShardLoad?(node: string, report: ShardLoadReport): void;
  onDisconnect?(node: string): void;
}

/** A RenewCertificate on a stream opened with `cert` (mTLS only). */
export type RenewCertificate = (
  cert: CertFacts,
  csrPem: string,
) => Promise<{ certPem: string } | { refused: string }>;

export interface AgentServiceOptions {
  registry: Registry;
  log: Logger;
  controlPlaneId: string;
  epoch: bigint;
  heartbeatIntervalMs: number;
  /** router.scrape_interval / scrape_timeout, told to every agent. */
  scrape: { intervalMs: number; timeoutMs: number };
  readMaxBytes: number;
  /** How long the first message may take before the stream is dropped. */
  registerTimeoutMs?: number;
  now?: () => number;
  /** Present with mTLS: signs a node's renewed certificate. */
  renew?: RenewCertificate;
  /**
   * mTLS: a stream must come with an authorized client certificate that is
   * not revoked, and may only register the node it names. Absent on the
   * plaintext (h2c) listener.
   */
  certificates?: StreamCertificates;
  /** Where refused claims on a name are kept for `ctl nodes`. */
  claims?: ClaimRefusals;
}

interface Session {
  node: string;
  instance: string;
  stream: BidiStream<ControlMessage>;
  /** The client certificate the stream was opened with (mTLS). */
  cert?: CertFacts;
}

export interface AgentServiceStats {
  registrations: number;
  rejected: Record<string, number>;
  messages: number;
}

export class AgentStreams {
  private readonly sessions = new Map<string, Session>();
  private readonly listeners: AgentStreamListener[] = [];
  readonly stats: AgentServiceStats = { registrations: 0, rejected: {}, messages: 0 };
  private readonly now: () => number;
  private broadcastSpreadMs = 0;

  constructor(private readonly opts: AgentServiceOptions) {
    this.now = opts.now ?? Date.now;
  }

  subscribe(listener: AgentStreamListener): void {
    this.listeners.push(listener);
  }

  private emit<K extends keyof AgentStreamListener>(
    event: K,
    ...args: Parameters<NonNullable<AgentStreamListener[K]>>
  ): void {
    for (const l of this.listeners) (l[event] as ((...a: typeof args) => void) | undefined)?.(...args);
  }

  /** A node's registry transition: logged here, for every listener. */
  private transition(t: Transition | undefined): void {
    if (!t) return;
    this.opts.log.info("node state changed", { ...t });
    this.emit("onTransition", t);
  }

  get connected(): number {
    return this.sessions.size;
  }

  isConnected(node: string): boolean {
    return this.sessions.has(node);
  }

  /** Sends a command to a node. False when the node has no open stream. */
  send(node: string, msg: ControlMessage): boolean {
    return this.sessions.get(node)?.stream.send(msg) ?? false;
  }

  /**
   * Ends a revoked node's stream with a Reject the agent acts on (it sets
   * its certificate aside and exits). False when it had no open stream.
   */
  revoke(node: string): boolean {
    const s = this.sessions.get(node);
    if (!s) return false;
    this.sessions.delete(node);
    this.reject("revoked");
    s.stream.send(
      create(ControlMessageSchema, {
        msg: {
          case: "reject",
          value: {
            code: "revoked",
            message: `the certificate of node "${node}" was revoked: re-admitting it takes a new join token`,
          },
        },
      }),
    );
    s.stream.end();
    this.opts.log.warn("revoked node disconnected", { node });
    return true;
  }

  /** Ends every stream, e.g. on shutdown. Agents reconnect on their own. */
  closeAll(): void {
    for (const s of this.sessions.values())
      s.stream.end({ code: "unavailable", message: "control plane shutting down" });
  }

  /**
   * A spread that keeps reconnects after a control plane restart to about 65
   * registrations a second whatever the fleet size: under 7 % of the fleet in
   * any one second, with room for chance.
   */
  reconnectSpreadMs(): number {
    return Math.max(1_000, Math.round(this.opts.registry.size * 15));
  }

  /**
   * Serves one Connect stream. `identity` is the peer's authorized client
   * certificate, when it presented one (server.ts reads it from the TLS
   * socket).
   */
  handle(req: Http2ServerRequest, res: Http2ServerResponse, identity?: CertFacts): void {
    serveConnectBidi(req, res, {
      input: AgentMessageSchema,
      output: ControlMessageSchema,
      readMaxBytes: this.opts.readMaxBytes,
      open: (stream) => this.open(stream, identity, req.socket.remoteAddress ?? "unknown"),
    });
  }

  private reject(code: string): void {
    this.stats.rejected[code] = (this.stats.rejected[code] ?? 0) + 1;
  }

  private refuse(stream: BidiStream<ControlMessage>, code: string, message: string): void {
    this.reject(code);
    stream.send(create(ControlMessageSchema, { msg: { case: "reject", value: { code, message } } }));
    stream.end();
  }

  private open(
    stream: BidiStream<ControlMessage>,
    identity: CertFacts | undefined,
    from: string,
  ): BidiCallbacks<AgentMessage> {
    let session: Session | undefined;
    const timer = setTimeout(() => {
      if (!session) this.refuse(stream, "protocol", "no Register within the timeout");
    }, this.opts.registerTimeoutMs ?? 10_000);
    return {
      onMessage: (msg) => {
        if (stream.ended) return;
        if (!session) {
          clearTimeout(timer);
          session = this.register(stream, msg, identity, from);
          return;
        }
        this.onMessage(session, msg);
      },
      onClose: () => {
        clearTimeout(timer);
        if (session && this.sessions.get(session.node) === session) {
          this.sessions.delete(session.node);
          this.opts.registry.disconnected(session.node);
          this.emit("onDisconnect", session.node);
          this.opts.log.info("agent disconnected", { node: session.node });
        }
      },
    };
  }

  private register(
    stream: BidiStream<ControlMessage>,
    msg: AgentMessage,
    identity: CertFacts | undefined,
    from: string,
  ): Session | undefined {
    const { registry, log } = this.opts;
    if (msg.msg.case !== "register") {
      this.refuse(stream, "protocol", "the first message on the stream must be Register");
      return undefined;
    }
    // A rogue or broken agent can only speak for its own node (docs/security.md).
    const certs = this.opts.certificates;
    const refusal =
      certs &&
      streamIdentityRefusal(certs, this.opts.claims, msg.msg.value.nodeName, identity, from, this.now());
    if (refusal) {
      log.warn(refusal.log, refusal.fields);
      this.refuse(stream, refusal.code, refusal.message);
      return undefined;
    }
    const checked = checkRegister(msg.msg.value);
    if (!checked.ok) {
      log.warn("agent registration refused", { reason: checked.reason, node: msg.msg.value.nodeName });
      this.refuse(stream, "invalid_register", checked.reason);
      return undefined;
    }
    const info = checked.info;
    const existing = this.sessions.get(info.name);
    if (existing && this.nameInUse(stream, existing, info, from)) return undefined;
    // The same agent reconnecting (or a silent old stream): the new one wins.
    if (existing) {
      this.sessions.delete(info.name);
      existing.stream.end({
        code: "already_exists",
        message: "replaced by a newer stream from the same node",
      });
    }
    const session: Session = {
      node: info.name,
      instance: info.agentInstance,
      stream,
      ...(identity ? { cert: identity } : {}),
    };
    this.sessions.set(info.name, session);
    this.stats.registrations++;
    this.transition(registry.register(info, this.now()));
    log.info("agent registered", {
      node: info.name,
      gpus: info.inventory.gpus.length,
      fabric: info.fabric,
      shards: msg.msg.value.shards.length,
      instance: info.agentInstance,
    });
    this.acknowledge(stream);
    this.emit("onRegister", info.name, msg.msg.value.shards);
    this.maybeBroadcastSpread();
    return session;
  }

  /** Whether another agent instance holds the name and was heard from lately (then it is refused). */
  private nameInUse(
    stream: BidiStream<ControlMessage>,
    existing: Session,
    info: RegistrationInfo,
    from: string,
  ): boolean {
    const { registry, log } = this.opts;
    if (existing.instance === info.agentInstance) return false;
    const record = registry.get(info.name);
    const silentMs = record ? this.now() - record.lastSeen : Number.POSITIVE_INFINITY;
    // A live node keeps its name: a second agent claiming it is far more
    // likely a copy-pasted --node flag than a legitimate replacement.
    if (silentMs < this.opts.heartbeatIntervalMs * 3) {
      log.warn("agent refused: node name is in use by a connected agent", {
        node: info.name,
        instance: info.agentInstance,
        from,
      });
      this.opts.claims?.note(info.name, { at: this.now(), reason: "name_in_use", from });
      this.refuse(stream, "name_in_use", `node name "${info.name}" is in use by a connected agent`);
      return true;
    }
    return false;
  }

  private acknowledge(stream: BidiStream<ControlMessage>): void {
    stream.send(
      create(ControlMessageSchema, {
        msg: {
          case: "registerAck",
          value: {
            controlPlaneId: this.opts.controlPlaneId,
            epoch: this.opts.epoch,
            heartbeatIntervalMs: this.opts.heartbeatIntervalMs,
            reconnectSpreadMs: this.reconnectSpreadMs(),
            scrape: this.opts.scrape,
          },
        },
      }),
    );
  }

  /**
   * Agents that registered while the fleet was small were told a small
   * spread; as the fleet grows, tell everyone again. Geometric steps keep
   * this to a handful of broadcasts however large the fleet.
   */
  private maybeBroadcastSpread(): void {
    const spread = this.reconnectSpreadMs();
    if (spread < this.broadcastSpreadMs * 1.25 || spread <= 1_000) return;
    this.broadcastSpreadMs = spread;
    this.broadcastSettings();
  }

  /** A reloaded configuration's scrape settings, to every connected agent at once. */
  setScrape(scrape: { intervalMs: number; timeoutMs: number }): void {
    if (scrape.intervalMs === this.opts.scrape.intervalMs && scrape.timeoutMs === this.opts.scrape.timeoutMs)
      return;
    this.opts.scrape = scrape;
    this.broadcastSettings();
  }

  private broadcastSettings(): void {
    const msg = create(ControlMessageSchema, {
      msg: {
        case: "settings",
        value: {
          heartbeatIntervalMs: this.opts.heartbeatIntervalMs,
          reconnectSpreadMs: this.reconnectSpreadMs(),
          scrape: this.opts.scrape,
        },
      },
    });
    for (const s of this.sessions.values()) s.stream.send(msg);
  }

  private onMessage(session: Session, msg: AgentMessage): void {
    if (this.sessions.get(session.node) !== session) return;
    const { registry } = this.opts;
    this.stats.messages++;
    // TLS checked the certificate once, at the handshake; a stream must not
    // outlive it. The agent reconnects with the renewed one, if it has one.
    // (Ending the stream runs onClose, which forgets the session.)
    if (session.cert && session.cert.notAfter <= this.now()) {
      this.refuse(
        session.stream,
        "certificate_expired",
        `the certificate this stream was opened with expired at ${new Date(session.cert.notAfter).toISOString()}`,
      );
      return;
    }
    if (registry.get(session.node)?.state === "lost") {
      // Its shards were released when it was declared lost, and only a
      // Register lists what still runs there: ending the stream makes the
      // agent reconnect and send one, so its engines are adopted rather than
      // placed over (docs/operating.md, "A node that comes back").
      this.opts.log.info("lost node heard from: asking it to register again", { node: session.node });
      session.stream.end();
      return;
    }
    this.transition(registry.seen(session.node, this.now()));
    const m = msg.msg;
    switch (m.case) {
      case "heartbeat":
        return;
      case "shardStatus": {
        const problem = checkShardStatus(m.value);
        if (problem) this.refuseShard(session, "invalid_shard_status", problem);
        else this.emit("onShardStatus", session.node, m.value);
        return;
      }
      case "shardLoad": {
        const problem = checkShardLoad(m.value);
        if (problem) this.refuseShard(session, "invalid_shard_load", problem);
        else this.emit("onShardLoad", session.node, m.value);
        return;
      }
      case "register":
        // A second Register on a live stream is a broken agent; ignore it
        // rather than let it rewrite the node mid-session.
        this.reject("protocol");
        return;
      case "renewCertificate":
        this.renew(session, m.value.csrPem);
        return;
      default:
        this.reject("unknown_message");
    }
  }

  /**
   * The agent resends its shards with the next Register, so ending the
   * stream is the only way it learns of the problem.
   */
  private refuseShard(session: Session, code: string, problem: string): void {
    this.opts.log.warn("agent sent an invalid shard report", { node: session.node, problem });
    this.refuse(session.stream, code, problem);
  }

  private renew(session: Session, csrPem: string): void {
    const answer = (result: { certPem: string } | { refused: string }) => {
      if (this.sessions.get(session.node) !== session) return;
      session.stream.send(
        create(ControlMessageSchema, {
          msg: {
            case: "certificateRenewal",
            value: {
              result:
                "certPem" in result
                  ? { case: "certPem", value: result.certPem }
                  : { case: "refused", value: result.refused },
            },
          },
        }),
      );
    };
    const onRenew = this.opts.renew;
    if (!session.cert || !onRenew) {
      this.reject("renew_without_tls");
      answer({ refused: "certificate renewal needs mTLS (agent_tls.enabled on the control plane)" });
      return;
    }
    onRenew(session.cert, csrPem).then(answer, (err: unknown) => {
      this.opts.log.error("certificate renewal failed", { node: session.node, error: String(err) });
      answer({ refused: "the control plane could not sign the certificate; retry later" });
    });
  }
}
