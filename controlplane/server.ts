import { randomUUID } from "node:crypto";
import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import {
  createServer as createHttp2Server,
  createSecureServer,
  type Http2SecureServer,
  type Http2Server,
  type Http2ServerRequest,
} from "node:http2";
import type { AddressInfo } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  createContextValues,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { errorMessage, type Logger } from "../common/log.ts";
import { MetricsRegistry } from "../common/prometheus.ts";
import { AgentService } from "../proto/gen/agent/v1/agent_pb.ts";
import {
  AdminAuth,
  AdminAuthError,
  isLoopbackListen,
  loadAdminTokens,
  remoteAddressKey,
} from "./admin/auth.ts";
import { controlRoutes } from "./admin/control-service.ts";
import { Enrollment, type EnrollPeer } from "./agentsvc/enroll.ts";
import { AgentStreams, CONNECT_PATH } from "./agentsvc/service.ts";
import { buildCatalog } from "./catalog.ts";
import { type CertFacts, CertificateStore, certFacts } from "./certificates.ts";
import { type LoadedConfig, startupGraceMs } from "./config/load.ts";
import { EdgePublisher, PublishedEndpoints } from "./edge-publisher.ts";
import { edgeSyncClient } from "./edgesync-client.ts";
import { IntentStore } from "./intent-store.ts";
import { JoinTokenStore } from "./join-tokens.ts";
import { parseListen } from "./listen.ts";
import { type Ca, ensureServerCert, loadOrCreateCa, type ServerCert } from "./pki/ca.ts";
import { Reconciler } from "./reconciler.ts";
import { Registry } from "./registry.ts";

export interface ControlPlane {
  readonly agentPort: number;
  readonly adminPort: number;
  readonly registry: Registry;
  readonly streams: AgentStreams;
  readonly reconciler: Reconciler;
  /** Applies a new configuration's desired state (SIGHUP); listeners and timers stay. */
  reload(loaded: LoadedConfig): void;
  close(): Promise<void>;
}

export interface ControlPlaneOptions {
  loaded: LoadedConfig;
  log: Logger;
  now?: () => number;
  /** `llmgw server --insecure-admin`: serve ControlService without a token on any address. */
  insecureAdmin?: boolean;
}

/** The Enroll caller, handed from the TLS socket to the connect handler. */
const enrollPeerKey = createContextKey<EnrollPeer>({}, { description: "the Enroll caller" });

export async function startControlPlane(opts: ControlPlaneOptions): Promise<ControlPlane> {
  const { config } = opts.loaded;
  const log = opts.log;
  const now = opts.now ?? Date.now;
  const startedAt = now();
  const c = config.control;
  const registry = new Registry(
    {
      unreachableAfterMs: c.unreachable_after,
      lostAfterMs: c.lost_after,
      startupGraceMs: startupGraceMs(config),
      lostFreezeFraction: c.lost_freeze_fraction,
    },
    startedAt,
  );
  let frozenLogged = false;
  const adminAuth = setUpAdminAuth(opts.loaded, log, opts.insecureAdmin ?? false);
  const catalog = buildCatalog(config);
  for (const w of catalog.warnings) log.warn("catalog warning", { warning: w });
  const intents = new IntentStore(join(config.data_dir, "llmgw.db"));
  const tls = config.agent_tls.enabled ? await setUpAgentTls(opts.loaded, log, now) : undefined;
  // Assigned below; the stream hooks only fire once listeners are up.
  let reconciler: Reconciler;
  const streams = new AgentStreams({
    registry,
    log: log.child({ component: "agentsvc" }),
    controlPlaneId: randomUUID(),
    epoch: BigInt(startedAt),
    heartbeatIntervalMs: c.heartbeat_interval,
    scrape: { intervalMs: config.router.scrape_interval, timeoutMs: config.router.scrape_timeout },
    readMaxBytes: c.max_message_bytes,
    now,
    ...(tls ? { certificates: tls.certs } : {}),
    hooks: {
      onTransition: (t) => {
        log.info("node state changed", { ...t });
        reconciler.trigger(`${t.node} ${t.to}`);
      },
      onRegister: (node, shards) => reconciler.onRegister(node, shards),
      onShardStatus: (node, status) => reconciler.onShardStatus(node, status),
      onShardLoad: (node, report) => reconciler.onShardLoad(node, report),
      ...(tls ? { onRenew: (cert, csrPem) => tls.enrollment.renew(cert, csrPem) } : {}),
    },
  });

  // Lifecycle resolution well under a second keeps the observed transition
  // times close to the configured ones without a timer per node.
  const tickEvery = Math.max(100, Math.min(1_000, Math.floor(c.unreachable_after / 10)));
  const ticker = setInterval(() => {
    for (const t of registry.tick(now())) {
      log.info("node state changed", { ...t });
      reconciler.trigger(`${t.node} ${t.to}`);
    }
    if (registry.lostFrozen !== frozenLogged) {
      frozenLogged = registry.lostFrozen;
      if (frozenLogged) {
        log.warn(
          "more than half of the fleet is unreachable: not declaring any node lost",
          registry.counts(),
        );
      } else log.info("lost-freeze lifted", registry.counts());
    }
  }, tickEvery);

  reconciler = new Reconciler(
    { registry, streams, intents, log: log.child({ component: "reconciler" }), now },
    config,
    catalog,
  );

  const metrics = new MetricsRegistry();
  metrics.gauge("llmgw_nodes", "Nodes by lifecycle state.", () =>
    Object.entries(registry.counts()).map(([state, value]) => ({ labels: { state }, value })),
  );
  metrics.gauge("llmgw_agent_streams", "Open agent streams.", () => streams.connected);
  metrics.gauge("llmgw_lost_frozen", "1 while the mass-unreachable guard holds lost back.", () =>
    registry.lostFrozen ? 1 : 0,
  );
  metrics.counter(
    "llmgw_agent_registrations_total",
    "Accepted agent registrations.",
    () => streams.stats.registrations,
  );
  metrics.counter(
    "llmgw_agent_messages_total",
    "Messages received on agent streams.",
    () => streams.stats.messages,
  );
  metrics.counter("llmgw_agent_rejections_total", "Agent streams or messages refused, by reason.", () =>
    Object.entries(streams.stats.rejected).map(([reason, value]) => ({ labels: { reason }, value })),
  );

  if (tls) {
    const e = tls.enrollment;
    metrics.counter(
      "llmgw_agent_enrollments_total",
      "Enroll calls and certificate renewals, by result.",
      () => [
        { labels: { result: "enrolled" }, value: e.stats.enrolled },
        { labels: { result: "renewed" }, value: e.stats.renewed },
        ...Object.entries(e.stats.refused).map(([result, value]) => ({ labels: { result }, value })),
      ],
    );
  }
  metrics.counter("llmgw_admin_auth_failures_total", "ControlService calls refused, by reason.", () =>
    Object.entries(adminAuth.failures).map(([reason, value]) => ({ labels: { reason }, value })),
  );

  metrics.gauge("llmgw_replicas", "Replicas in the table.", () => reconciler.table.size);
  metrics.counter("llmgw_reconcile_passes_total", "Reconcile passes run.", () => reconciler.passes);
  metrics.gauge(
    "llmgw_reconcile_last_pass_seconds",
    "Duration of the last reconcile pass.",
    () => reconciler.lastPassMs / 1000,
  );
  metrics.gauge("process_resident_memory_bytes", "Resident set size.", () => process.memoryUsage().rss);
  metrics.gauge("nodejs_heap_used_bytes", "V8 heap in use.", () => process.memoryUsage().heapUsed);
  metrics.gauge("nodejs_external_memory_bytes", "Memory held outside the V8 heap (buffers, native).", () => {
    const m = process.memoryUsage();
    return m.external;
  });

  // Every other AgentService RPC goes through connect's router; the one
  // stream every node holds open has its own lean handler (connect-bidi.ts).
  const agentRouter = connectNodeAdapter({
    routes: (router: ConnectRouter) => {
      router.service(AgentService, {
        connect: () => {
          throw new ConnectError("served by the stream handler", Code.Internal);
        },
        enroll: (req, ctx) => {
          if (!tls) {
            throw new ConnectError(
              "enrollment (mTLS) is not enabled on this control plane (agent_tls.enabled)",
              Code.Unimplemented,
            );
          }
          return tls.enrollment.enroll(req, ctx.values.get(enrollPeerKey));
        },
      });
    },
    readMaxBytes: c.max_message_bytes,
    contextValues: (req) => {
      const cert = peerCertificate(req as Http2ServerRequest);
      return createContextValues().set(enrollPeerKey, {
        ...(req.socket.remoteAddress ? { address: req.socket.remoteAddress } : {}),
        ...(cert ? { cert } : {}),
      });
    },
  });
  // With mTLS every client may connect (rejectUnauthorized: false) so that
  // a new agent can call Enroll; the stream itself demands a certificate.
  const agentServer: Http2Server | Http2SecureServer = tls
    ? createSecureServer(
        {
          ...tls.context(),
          requestCert: true,
          rejectUnauthorized: false,
          allowHTTP1: false,
        },
        (req, res) => {
          if (req.url === CONNECT_PATH) streams.handle(req, res, peerCertificate(req));
          else agentRouter(req, res);
        },
      )
    : createHttp2Server({}, (req, res) => {
        if (req.url === CONNECT_PATH) streams.handle(req, res);
        else agentRouter(req, res);
      });
  // The server certificate is checked again twice a day, so one that nears
  // expiry on a long-running control plane is replaced without a restart.
  const renewTimer = tls
    ? setInterval(() => {
        tls
          .renew()
          .then((renewed) => {
            if (renewed) (agentServer as Http2SecureServer).setSecureContext(tls.context());
          })
          .catch((err) => log.error("agent listener certificate renewal failed", { error: String(err) }));
      }, 12 * 3_600_000)
    : undefined;
  renewTimer?.unref();
  const revocation = tls && {
    revoke(node: string) {
      if (!registry.get(node) && !tls.certs.knows(node))
        throw new ConnectError(`node "${node}" is not known to this control plane`, Code.NotFound);
      const serials = tls.certs.revokeNode(node, now());
      const disconnected = streams.revoke(node);
      log.warn("node revoked", { node, serials, disconnected });
      const t = registry.revoke(node, now());
      if (t) {
        log.info("node state changed", { ...t });
        reconciler.trigger(`${node} revoked`);
      }
      return { serials, disconnected };
    },
    revokedNodes: () => tls.certs.revokedNodes(),
  };
  let refusedLoggedAt = 0;
  let refusedSinceLog = 0;
  const adminServer: HttpServer = createHttpServer(
    connectNodeAdapter({
      routes: controlRoutes({
        registry,
        intents,
        reconciler,
        now,
        ...(tls ? { joinTokens: tls.enrollment } : {}),
        ...(revocation ? { revocation } : {}),
      }),
      interceptors: [
        adminAuth.interceptor((v, method, remote) => {
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
          !adminAuth.allowsRead(req.headers.authorization ?? null, req.socket.remoteAddress)
        ) {
          res.writeHead(401, { "content-type": "text/plain", "www-authenticate": "Bearer" });
          res.end(
            "/metrics needs the admin token (Authorization: Bearer …) or a read_only_networks address\n",
          );
        } else if (req.url === "/metrics") {
          res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
          res.end(metrics.render());
        } else {
          res.writeHead(404, { "content-type": "text/plain" });
          res.end("not found\n");
        }
      },
    }),
  );

  const agentPort = await listen(agentServer, config.agent_listen);
  const adminPort = await listen(adminServer, config.admin_listen);
  if (tls) {
    log.info("agent listener is mTLS: agents enroll with a join token (llmgw ctl tokens create)", {
      agent_listen: config.agent_listen,
      hostnames: defaultTlsHostnames(config.agent_tls.hostnames),
      ca_fingerprint: tls.ca.fingerprint,
    });
  } else {
    log.warn("agent listener is plaintext h2c: keep it on a trusted network until mTLS is enabled", {
      agent_listen: config.agent_listen,
    });
  }
  reconciler.start();
  const edgeUrl = config.edge.url;
  const edgeToken = process.env[config.edge.token_env];
  let publisher: EdgePublisher | undefined;
  const published =
    edgeUrl && edgeToken ? new PublishedEndpoints(join(config.data_dir, "llmgw.db")) : undefined;
  if (edgeUrl && edgeToken) {
    publisher = new EdgePublisher({
      client: edgeSyncClient(edgeUrl, edgeToken),
      log: log.child({ component: "edge-publisher", edge: edgeUrl }),
      loadRefreshMs: Math.max(1_000, Math.floor(config.router.stale_after / 3)),
      graceUntil: startedAt + startupGraceMs(config),
      holdUntil: startedAt + Math.max(startupGraceMs(config), c.lost_after),
      ...(published ? { store: published } : {}),
      facts: () => ({
        replicas: reconciler.table.list(),
        address: (node) => registry.get(node)?.advertiseAddress,
        load: (id, rank, node) => reconciler.runtime.get(`${id}#${rank}@${node}`)?.load,
        staticEndpoints: reconciler.currentConfig.endpoints,
        via: reconciler.currentConfig.edge.via,
        now: now(),
      }),
    });
    publisher.start(catalog, opts.loaded.routerSection);
  } else if (edgeUrl) {
    log.warn("edge.url is set but the EdgeSync secret is not: not publishing to the edge", {
      token_env: config.edge.token_env,
    });
  } else
    log.info("no edge.url: endpoints and load are not published (router-only setups use ctl endpoints set)");
  log.info("control plane listening", { agentPort, adminPort, config: opts.loaded.source });

  return {
    agentPort,
    adminPort,
    registry,
    streams,
    reconciler,
    reload(next) {
      // A token file is read again, so a token can be rotated without a
      // restart (add the new line, move clients over, remove the old one).
      try {
        const { tokens, source } = loadAdminTokens(next.config.admin);
        if (adminAuth.enabled && tokens.length === 0)
          log.error("admin token reload refused: the new configuration has none; keeping the current one(s)");
        else {
          adminAuth.setTokens(tokens);
          if (tokens.length > 0) log.info("admin tokens loaded", { source, tokens: tokens.length });
        }
      } catch (err) {
        log.error("admin token reload refused; keeping the current one(s)", { error: errorMessage(err) });
      }
      const nextCatalog = buildCatalog(next.config);
      reconciler.reload(next.config, nextCatalog);
      publisher?.setCatalog(nextCatalog);
      publisher?.setRouterSettings(next.routerSection);
      streams.setScrape({
        intervalMs: next.config.router.scrape_interval,
        timeoutMs: next.config.router.scrape_timeout,
      });
      log.info("configuration reloaded", { source: next.source, models: nextCatalog.models.length });
    },
    async close() {
      clearInterval(ticker);
      if (renewTimer) clearInterval(renewTimer);
      reconciler.stop();
      publisher?.stop();
      published?.close();
      intents.close();
      tls?.tokens.close();
      tls?.certs.close();
      streams.closeAll();
      await Promise.all([closeServer(agentServer), closeServer(adminServer)]);
    },
  };
}

/**
 * The admin API's credentials. No token is refused on an address others
 * can reach, unless the operator said --insecure-admin, out loud.
 */
function setUpAdminAuth(loaded: LoadedConfig, log: Logger, insecure: boolean): AdminAuth {
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

interface AgentTls {
  ca: Ca;
  tokens: JoinTokenStore;
  certs: CertificateStore;
  enrollment: Enrollment;
  /** key, cert chain and CA for the listener's secure context. */
  context(): { key: string; cert: string; ca: string };
  /** Issues the server certificate again when due; true when it did. */
  renew(): Promise<boolean>;
}

/** The SANs of the agent listener's certificate when the config names none. */
function defaultTlsHostnames(configured: readonly string[] | undefined): string[] {
  return configured ? [...configured] : [hostname(), "localhost", "127.0.0.1"];
}

/** The CA, the listener's certificate and the token store, under data_dir. */
async function setUpAgentTls(loaded: LoadedConfig, log: Logger, now: () => number): Promise<AgentTls> {
  const { config } = loaded;
  const t = config.agent_tls;
  const hostnames = defaultTlsHostnames(t.hostnames);
  const dir = join(config.data_dir, "pki");
  const { ca, created } = await loadOrCreateCa(dir, now);
  if (created) log.info("created the agent CA", { dir, fingerprint: ca.fingerprint });
  const issue = async (): Promise<boolean> => {
    const next = await ensureServerCert(ca, dir, hostnames, now);
    if (next.issued)
      log.info("issued the agent listener certificate", {
        reason: next.issued,
        hostnames,
        notAfter: next.notAfter.toISOString(),
      });
    server = next;
    return next.issued !== undefined;
  };
  let server: ServerCert | undefined;
  await issue();
  const tokens = new JoinTokenStore(join(config.data_dir, "llmgw.db"));
  const certs = new CertificateStore(join(config.data_dir, "llmgw.db"));
  const enrollment = new Enrollment({
    ca,
    tokens,
    certs,
    enrollPerMinute: t.enroll_per_minute,
    clientCertValidityMs: t.client_cert_validity,
    defaultTokenTtlMs: t.join_token_ttl,
    log: log.child({ component: "enroll" }),
    now,
  });
  return {
    ca,
    tokens,
    certs,
    enrollment,
    // The chain includes the CA, so an agent holding only a join token can
    // read the CA certificate off the handshake and check its fingerprint.
    context: () => ({
      key: server!.keyPem,
      cert: `${server!.certPem.trim()}\n${ca.certPem.trim()}\n`,
      ca: ca.certPem,
    }),
    renew: issue,
  };
}

const CLIENT_AUTH = "1.3.6.1.5.5.7.3.2";

/**
 * The certificate a TLS peer authenticated with: a client certificate that
 * chains to our CA, is in its validity period and is meant for client
 * authentication. Its CN is the one node the peer may speak for. Undefined
 * for anyone else (no certificate, another CA, an expired one, the server's
 * own certificate).
 */
function peerCertificate(req: Http2ServerRequest): CertFacts | undefined {
  const socket = req.socket as TLSSocket;
  if (!socket.authorized || typeof socket.getPeerCertificate !== "function") return undefined;
  const cert = socket.getPeerCertificate();
  if (!cert?.raw || !cert.ext_key_usage?.includes(CLIENT_AUTH)) return undefined;
  const facts = certFacts(cert.raw);
  return facts.node ? facts : undefined;
}

function listen(server: HttpServer | Http2Server | Http2SecureServer, addr: string): Promise<number> {
  const { host, port } = parseListen(addr);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

function closeServer(server: HttpServer | Http2Server | Http2SecureServer): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    setTimeout(resolve, 2_000).unref();
    if ("closeAllConnections" in server) server.closeAllConnections();
  });
}
