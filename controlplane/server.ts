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
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "../common/log.ts";
import { MetricsRegistry } from "../common/prometheus.ts";
import { AgentService } from "../proto/gen/agent/v1/agent_pb.ts";
import { controlRoutes } from "./admin/control-service.ts";
import { Enrollment } from "./agentsvc/enroll.ts";
import { AgentStreams, CONNECT_PATH } from "./agentsvc/service.ts";
import { buildCatalog } from "./catalog.ts";
import { type LoadedConfig, startupGraceMs } from "./config/load.ts";
import { EdgePublisher } from "./edge-publisher.ts";
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
}

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
    readMaxBytes: c.max_message_bytes,
    now,
    requireIdentity: tls !== undefined,
    hooks: {
      onTransition: (t) => {
        log.info("node state changed", { ...t });
        reconciler.trigger(`${t.node} ${t.to}`);
      },
      onRegister: (node, shards) => reconciler.onRegister(node, shards),
      onShardStatus: (node, status) => reconciler.onShardStatus(node, status),
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
    metrics.counter("llmgw_agent_enrollments_total", "Enroll calls, by result.", () => [
      { labels: { result: "enrolled" }, value: e.stats.enrolled },
      ...Object.entries(e.stats.refused).map(([result, value]) => ({ labels: { result }, value })),
    ]);
  }

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
        enroll: (req) => {
          if (!tls) {
            throw new ConnectError(
              "enrollment (mTLS) is not enabled on this control plane (agent_tls.enabled)",
              Code.Unimplemented,
            );
          }
          return tls.enrollment.enroll(req);
        },
      });
    },
    readMaxBytes: c.max_message_bytes,
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
          if (req.url === CONNECT_PATH) streams.handle(req, res, peerIdentity(req));
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
  const adminServer: HttpServer = createHttpServer(
    connectNodeAdapter({
      routes: controlRoutes({
        registry,
        intents,
        reconciler,
        now,
        ...(tls ? { joinTokens: tls.enrollment } : {}),
      }),
      fallback: (req, res) => {
        if (req.url === "/healthz") {
          res.writeHead(200, { "content-type": "text/plain" });
          res.end("ok\n");
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
  if (edgeUrl && edgeToken) {
    publisher = new EdgePublisher({
      client: edgeSyncClient(edgeUrl, edgeToken),
      log: log.child({ component: "edge-publisher", edge: edgeUrl }),
      loadRefreshMs: Math.max(1_000, Math.floor(config.router.stale_after / 3)),
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
      const nextCatalog = buildCatalog(next.config);
      reconciler.reload(next.config, nextCatalog);
      publisher?.setCatalog(nextCatalog);
      publisher?.setRouterSettings(next.routerSection);
      log.info("configuration reloaded", { source: next.source, models: nextCatalog.models.length });
    },
    async close() {
      clearInterval(ticker);
      if (renewTimer) clearInterval(renewTimer);
      reconciler.stop();
      publisher?.stop();
      intents.close();
      tls?.tokens.close();
      streams.closeAll();
      await Promise.all([closeServer(agentServer), closeServer(adminServer)]);
    },
  };
}

interface AgentTls {
  ca: Ca;
  tokens: JoinTokenStore;
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
  const enrollment = new Enrollment({
    ca,
    tokens,
    clientCertValidityMs: t.client_cert_validity,
    defaultTokenTtlMs: t.join_token_ttl,
    log: log.child({ component: "enroll" }),
    now,
  });
  return {
    ca,
    tokens,
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
 * The node a TLS peer may speak for: the CN of a client certificate that
 * chains to our CA and is meant for client authentication. Undefined for
 * anyone else (no certificate, another CA, the server's own certificate).
 */
function peerIdentity(req: Http2ServerRequest): string | undefined {
  const socket = req.socket as TLSSocket;
  if (!socket.authorized) return undefined;
  const cert = socket.getPeerCertificate();
  if (!cert?.subject) return undefined;
  if (!cert.ext_key_usage?.includes(CLIENT_AUTH)) return undefined;
  const cn = cert.subject.CN;
  return typeof cn === "string" ? cn : undefined;
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
