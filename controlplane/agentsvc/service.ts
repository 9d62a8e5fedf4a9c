import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { AsyncQueue } from "../../common/async-queue.ts";
import type { Logger } from "../../common/log.ts";
import {
  type AgentMessage,
  AgentService,
  type ControlMessage,
  ControlMessageSchema,
  type ShardStatus,
} from "../../proto/gen/agent/v1/agent_pb.ts";
import type { Registry, Transition } from "../registry.ts";
import { checkRegister } from "./register.ts";

/**
 * The stream handler. It is also the only thing that can deliver a command
 * to a node, because it holds the open streams: the reconciler dispatches
 * through `send`.
 */
export interface AgentServiceHooks {
  onTransition?(t: Transition): void;
  onRegister?(node: string, shards: ShardStatus[]): void;
  onShardStatus?(node: string, status: ShardStatus): void;
  onDisconnect?(node: string): void;
}

export interface AgentServiceOptions {
  registry: Registry;
  log: Logger;
  controlPlaneId: string;
  epoch: bigint;
  heartbeatIntervalMs: number;
  /** How long the first message may take before the stream is dropped. */
  registerTimeoutMs?: number;
  now?: () => number;
  hooks?: AgentServiceHooks;
}

interface Session {
  node: string;
  instance: string;
  outbox: AsyncQueue<ControlMessage>;
  close(reason: string): void;
}

export interface AgentServiceStats {
  registrations: number;
  rejected: Record<string, number>;
  messages: number;
}

export class AgentStreams {
  private readonly sessions = new Map<string, Session>();
  readonly stats: AgentServiceStats = { registrations: 0, rejected: {}, messages: 0 };
  private readonly now: () => number;

  constructor(private readonly opts: AgentServiceOptions) {
    this.now = opts.now ?? Date.now;
  }

  get connected(): number {
    return this.sessions.size;
  }

  isConnected(node: string): boolean {
    return this.sessions.has(node);
  }

  /** Queues a command for a node. False when the node has no open stream. */
  send(node: string, msg: ControlMessage): boolean {
    return this.sessions.get(node)?.outbox.push(msg) ?? false;
  }

  /** Ends every stream, e.g. on shutdown. Agents reconnect on their own. */
  closeAll(reason: string): void {
    for (const s of this.sessions.values()) s.close(reason);
  }

  /**
   * A spread that keeps reconnects after a control plane restart to roughly
   * 80 registrations a second, whatever the fleet size: about 8 % of the
   * fleet in any one second.
   */
  reconnectSpreadMs(): number {
    return Math.max(1_000, Math.round(this.opts.registry.size * 12.5));
  }

  routes(router: ConnectRouter): void {
    router.service(AgentService, {
      connect: (requests, ctx) => this.connect(requests, ctx),
      enroll: async () => {
        throw new ConnectError("enrollment (mTLS) is not enabled on this control plane", Code.Unimplemented);
      },
    });
  }

  private reject(code: string): void {
    this.stats.rejected[code] = (this.stats.rejected[code] ?? 0) + 1;
  }

  private async *connect(
    requests: AsyncIterable<AgentMessage>,
    ctx: HandlerContext,
  ): AsyncIterable<ControlMessage> {
    const { registry, log } = this.opts;
    const iterator = requests[Symbol.asyncIterator]();
    const first = await this.firstMessage(iterator, ctx);
    if (first.msg.case !== "register") {
      this.reject("protocol");
      yield rejectMessage("protocol", "the first message on the stream must be Register");
      return;
    }
    const checked = checkRegister(first.msg.value);
    if (!checked.ok) {
      this.reject("invalid_register");
      log.warn("agent registration refused", { reason: checked.reason, node: first.msg.value.nodeName });
      yield rejectMessage("invalid_register", checked.reason);
      return;
    }
    const info = checked.info;
    const existing = this.sessions.get(info.name);
    if (existing && existing.instance !== info.agentInstance) {
      const record = registry.get(info.name);
      const silentMs = record ? this.now() - record.lastSeen : Number.POSITIVE_INFINITY;
      // A live node keeps its name: a second agent claiming it is far more
      // likely a copy-pasted --node flag than a legitimate replacement.
      if (silentMs < this.opts.heartbeatIntervalMs * 3) {
        this.reject("name_in_use");
        log.warn("agent refused: node name is in use by a connected agent", { node: info.name });
        yield rejectMessage("name_in_use", `node name "${info.name}" is in use by a connected agent`);
        return;
      }
    }
    // Same instance reconnecting (or a silent old stream): the new stream wins.
    existing?.close("replaced by a new stream from the same node");

    const outbox = new AsyncQueue<ControlMessage>();
    const session: Session = {
      node: info.name,
      instance: info.agentInstance,
      outbox,
      close: (reason) => {
        if (outbox.isClosed) return;
        log.debug("closing agent stream", { node: info.name, reason });
        outbox.close();
      },
    };
    this.sessions.set(info.name, session);
    this.stats.registrations++;
    const t = registry.register(info, this.now());
    if (t) this.opts.hooks?.onTransition?.(t);
    log.info("agent registered", {
      node: info.name,
      gpus: info.inventory.gpus.length,
      fabric: info.fabric,
      shards: first.msg.value.shards.length,
      instance: info.agentInstance,
    });
    outbox.push(
      create(ControlMessageSchema, {
        msg: {
          case: "registerAck",
          value: {
            controlPlaneId: this.opts.controlPlaneId,
            epoch: this.opts.epoch,
            heartbeatIntervalMs: this.opts.heartbeatIntervalMs,
            reconnectSpreadMs: this.reconnectSpreadMs(),
          },
        },
      }),
    );
    this.opts.hooks?.onRegister?.(info.name, first.msg.value.shards);

    const reader = this.readLoop(iterator, session).catch((err: unknown) => {
      const code = err instanceof ConnectError ? Code[err.code] : "unknown";
      log.warn("agent stream failed", { node: info.name, code, error: String(err) });
    });
    ctx.signal.addEventListener("abort", () => session.close("stream aborted"), { once: true });
    try {
      yield* outbox;
    } finally {
      session.close("handler finished");
      await reader;
      if (this.sessions.get(info.name) === session) {
        this.sessions.delete(info.name);
        registry.disconnected(info.name);
        this.opts.hooks?.onDisconnect?.(info.name);
        log.info("agent disconnected", { node: info.name });
      }
    }
  }

  private async firstMessage(
    iterator: AsyncIterator<AgentMessage>,
    ctx: HandlerContext,
  ): Promise<AgentMessage> {
    const timeoutMs = this.opts.registerTimeoutMs ?? 10_000;
    let timer: NodeJS.Timeout | undefined;
    try {
      const next = await Promise.race([
        iterator.next(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new ConnectError("no Register within the timeout", Code.DeadlineExceeded)),
            timeoutMs,
          );
        }),
      ]);
      if (next.done) throw new ConnectError("stream ended before Register", Code.InvalidArgument);
      return next.value;
    } catch (err) {
      if (!ctx.signal.aborted) this.reject("protocol");
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  private async readLoop(iterator: AsyncIterator<AgentMessage>, session: Session): Promise<void> {
    const { registry, hooks } = this.opts;
    try {
      for (;;) {
        const next = await iterator.next();
        if (next.done) return;
        if (this.sessions.get(session.node) !== session) return;
        this.stats.messages++;
        const t = registry.seen(session.node, this.now());
        if (t) hooks?.onTransition?.(t);
        const m = next.value.msg;
        switch (m.case) {
          case "heartbeat":
            break;
          case "shardStatus":
            hooks?.onShardStatus?.(session.node, m.value);
            break;
          case "register":
            // A second Register on a live stream is a broken agent; ignore it
            // rather than let it rewrite the node mid-session.
            this.reject("protocol");
            break;
          default:
            this.reject("unknown_message");
        }
      }
    } finally {
      session.close("agent stream ended");
    }
  }
}

function rejectMessage(code: string, message: string): ControlMessage {
  return create(ControlMessageSchema, { msg: { case: "reject", value: { code, message } } });
}
