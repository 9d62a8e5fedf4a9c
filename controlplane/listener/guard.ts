import type { Server as HttpServer } from "node:http";
import type { Http2SecureServer, Http2Server, ServerHttp2Session } from "node:http2";
import type { Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import type { Logger } from "../../common/log.ts";
import { sourceKey } from "../agentsvc/enroll-limit.ts";
import type { ListenersConfig } from "../config/schema.ts";
import { ConnectionBudget } from "./connection-budget.ts";

/**
 * The bounds every listener keeps (config `listeners`, docs/security.md):
 * a cap on connections, in total and per source address, and no connection
 * kept that does nothing. Counted for /metrics by listener.
 */
export interface ListenerGuard {
  readonly name: "agent" | "admin";
  readonly budget: ConnectionBudget;
  /** Sessions closed for doing nothing, by why: unauthenticated, idle. */
  readonly closed: Record<string, number>;
}

function newGuard(name: ListenerGuard["name"], limits: ListenersConfig): ListenerGuard {
  return {
    name,
    budget: new ConnectionBudget({
      total: limits.max_connections,
      perAddress: limits.max_connections_per_address,
    }),
    closed: {},
  };
}

/**
 * Refuses a connection over either cap as it arrives, before TLS or HTTP
 * spend anything on it. One log line a minute per listener says a cap is
 * being hit, with the last source.
 */
function capConnections(server: HttpServer | Http2Server | Http2SecureServer, g: ListenerGuard, log: Logger) {
  let loggedAt = 0;
  let refusedSinceLog = 0;
  server.on("connection", (socket: Socket) => {
    const source = sourceKey(socket.remoteAddress);
    const admitted = g.budget.admit(source);
    if (!admitted.ok) {
      socket.destroy();
      refusedSinceLog++;
      if (Date.now() - loggedAt >= 60_000) {
        log.warn("connection refused: listener at its cap", {
          listener: g.name,
          cap: admitted.reason,
          from: source,
          refused: refusedSinceLog,
        });
        loggedAt = Date.now();
        refusedSinceLog = 0;
      }
      return;
    }
    socket.once("close", () => g.budget.release(source));
  });
}

/**
 * The agent listener: a session with no stream in flight is closed after
 * `auth_timeout` unless its peer authenticated with a client certificate
 * (an agent between two calls, or an Enroll caller done), after
 * `idle_timeout` if it did. An agent holds its Connect stream for as long
 * as it runs, so only sessions that do nothing are ever closed.
 */
export function guardAgentListener(
  server: Http2Server | Http2SecureServer,
  limits: ListenersConfig,
  log: Logger,
): ListenerGuard {
  const g = newGuard("agent", limits);
  capConnections(server, g, log);
  server.on("session", (session: ServerHttp2Session) => {
    let streams = 0;
    let timer: NodeJS.Timeout | undefined;
    const arm = () => {
      clearTimeout(timer);
      const authenticated = (session.socket as TLSSocket | undefined)?.authorized === true;
      const reason = authenticated ? "idle" : "unauthenticated";
      timer = setTimeout(
        () => {
          if (streams > 0 || session.destroyed) return;
          g.closed[reason] = (g.closed[reason] ?? 0) + 1;
          session.destroy();
        },
        authenticated ? limits.idle_timeout : limits.auth_timeout,
      );
      timer.unref();
    };
    arm();
    session.on("stream", (stream) => {
      streams++;
      clearTimeout(timer);
      stream.once("close", () => {
        streams--;
        if (streams === 0 && !session.destroyed) arm();
      });
    });
    session.once("close", () => clearTimeout(timer));
  });
  return g;
}

/**
 * The admin listener (HTTP/1.1): Node's own timers, set to the same
 * bounds — request headers within `auth_timeout`, a kept-alive connection
 * with nothing in flight closed after `idle_timeout` of silence.
 */
export function guardAdminListener(server: HttpServer, limits: ListenersConfig, log: Logger): ListenerGuard {
  const g = newGuard("admin", limits);
  capConnections(server, g, log);
  server.headersTimeout = limits.auth_timeout;
  server.requestTimeout = Math.max(limits.idle_timeout, limits.auth_timeout + 1);
  server.setTimeout(limits.idle_timeout, (socket) => {
    g.closed.idle = (g.closed.idle ?? 0) + 1;
    socket.destroy();
  });
  return g;
}
