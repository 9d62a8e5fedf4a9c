/**
 * The operators' listener: ControlService behind the admin token, the
 * dashboard at / (whose page signs in with that token), plus /healthz and
 * /metrics (which needs the token or a read-only network).
 */
import { createServer, type Server } from "node:http";
import { hostname } from "node:os";
import { createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { parseListen } from "../common/listen.ts";
import type { Logger } from "../common/log.ts";
import type { MetricsRegistry } from "../common/prometheus.ts";
import {
  AdminAuth,
  AdminAuthError,
  isLoopbackListen,
  loadAdminTokens,
  remoteAddressKey,
} from "./admin/auth.ts";
import { type ControlServiceDeps, controlRoutes } from "./admin/control-service.ts";
import { serveDashboard } from "./admin/dashboard.ts";
import { hostAllowed, hostOf } from "./admin/host-check.ts";
import type { LoadedConfig } from "./config/load.ts";

/**
 * The admin API's credentials. No token is refused on an address others
 * can reach, unless the operator said --insecure-admin, out loud.
 */
export function setUpAdminAuth(loaded: LoadedConfig, log: Logger, insecure: boolean): AdminAuth {
  const { config } = loaded;
  const { tokens, source } = loadAdminTokens(config.admin);
  const auth = new AdminAuth(tokens, config.admin.read_only_networks);
  if (tokens.length > 0) {
    log.info("admin API requires a token", {
      source,
      tokens: tokens.length,
      read_only_networks: config.admin.read_only_networks,
    });
    return auth;
  }
  if (isLoopbackListen(config.admin_listen)) {
    log.warn(
      "admin API has no token: every process on this host may drain nodes and create join tokens (set $LLMGW_ADMIN_TOKEN or admin.token_file)",
      { admin_listen: config.admin_listen },
    );
    return auth;
  }
  if (!insecure) {
    throw new AdminAuthError(
      `admin_listen ${config.admin_listen} is reachable from other hosts, and no admin token is configured (admin.token_file, or $${config.admin.token_env}): anyone who reaches it could drain the fleet or enroll a rogue node. Configure a token, bind admin_listen to 127.0.0.1, or pass --insecure-admin to accept the risk`,
    );
  }
  log.error(
    "INSECURE: --insecure-admin: the admin API has no token and listens beyond loopback; anyone who reaches it can drain the fleet, revoke nodes and create join tokens",
    { admin_listen: config.admin_listen },
  );
  return auth;
}

/** The names the admin listener answers to besides IP addresses (admin/host-check.ts). */
export function adminHostNames(loaded: LoadedConfig): Set<string> {
  const { config } = loaded;
  const listenHost = parseListen(config.admin_listen).host;
  return new Set(
    ["localhost", hostname(), ...(listenHost ? [listenHost] : []), ...config.admin.allowed_hosts].map((h) =>
      h.toLowerCase(),
    ),
  );
}

export interface AdminListenerDeps {
  control: ControlServiceDeps;
  /** What the Host header may name (adminHostNames). */
  hosts: ReadonlySet<string>;
  auth: AdminAuth;
  metrics: MetricsRegistry;
  log: Logger;
  now: () => number;
}

export function adminListener(d: AdminListenerDeps): Server {
  const { auth, metrics, log, now } = d;
  let refusedLoggedAt = 0;
  let refusedSinceLog = 0;
  const handler = connectNodeAdapter({
    routes: controlRoutes(d.control),
    interceptors: [
      auth.interceptor((v, method, remote) => {
        // Someone guessing tokens must not flood the log: a line a second at most.
        refusedSinceLog++;
        if (now() - refusedLoggedAt < 1_000) return;
        log.warn("admin call refused", {
          method,
          reason: v.reason,
          from: remote,
          refused: refusedSinceLog,
        });
        refusedLoggedAt = now();
        refusedSinceLog = 0;
      }),
    ],
    contextValues: (req) => createContextValues().set(remoteAddressKey, req.socket.remoteAddress),
    fallback: (req, res) => {
      if (req.url === "/healthz") {
        res.writeHead(200, { "content-type": "text/plain" });
        res.end("ok\n");
      } else if (
        req.url === "/metrics" &&
        !auth.allowsRead(req.headers.authorization ?? null, req.socket.remoteAddress)
      ) {
        res.writeHead(401, { "content-type": "text/plain", "www-authenticate": "Bearer" });
        res.end("/metrics needs the admin token (Authorization: Bearer …) or a read_only_networks address\n");
      } else if (req.url === "/metrics") {
        res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
        res.end(metrics.render());
      } else {
        void serveDashboard(req, res).then((served) => {
          if (served) return;
          res.writeHead(404, { "content-type": "text/plain" });
          res.end("not found\n");
        });
      }
    },
  });
  // Connections are checked each second, so `listeners.auth_timeout` on
  // request headers holds to about a second rather than Node's default 30 s.
  return createServer({ connectionsCheckingInterval: 1_000 }, (req, res) => {
    // /healthz says only "ok": probes may use any name.
    if (req.url !== "/healthz" && !hostAllowed(req.headers.host, d.hosts)) {
      res.writeHead(403, { "content-type": "text/plain" });
      res.end(
        `Host "${hostOf(req.headers.host ?? "")}" is not a name of this control plane: use its address, or add the name to admin.allowed_hosts\n`,
      );
      return;
    }
    handler(req, res);
  });
}
