import { randomUUID } from "node:crypto";
import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import { createServer as createHttp2Server, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "../common/log.ts";
import { MetricsRegistry } from "../common/prometheus.ts";
import { AgentService } from "../proto/gen/agent/v1/agent_pb.ts";
import { controlRoutes } from "./admin/control-service.ts";
import { AgentStreams, CONNECT_PATH } from "./agentsvc/service.ts";
import { buildCatalog } from "./catalog.ts";
import { type LoadedConfig, startupGraceMs } from "./config/load.ts";
import { edgeSyncClient } from "./ctl/keys.ts";
import { EdgePublisher } from "./edge-publisher.ts";
import { IntentStore } from "./intent-store.ts";
import { parseListen } from "./listen.ts";
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
        enroll: () => {
          throw new ConnectError(
            "enrollment (mTLS) is not enabled on this control plane",
            Code.Unimplemented,
          );
        },
      });
    },
    readMaxBytes: c.max_message_bytes,
  });
  const agentServer: Http2Server = createHttp2Server({}, (req, res) => {
    if (req.url === CONNECT_PATH) streams.handle(req, res);
    else agentRouter(req, res);
  });
  const adminServer: HttpServer = createHttpServer(
    connectNodeAdapter({
      routes: controlRoutes({ registry, intents, reconciler, now }),
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
  log.warn("agent listener is plaintext h2c: keep it on a trusted network until mTLS is enabled", {
    agent_listen: config.agent_listen,
  });
  reconciler.start();
  const edgeUrl = config.edge.url;
  const edgeToken = process.env[config.edge.token_env];
  let publisher: EdgePublisher | undefined;
  if (edgeUrl && edgeToken) {
    publisher = new EdgePublisher({
      client: edgeSyncClient(edgeUrl, edgeToken),
      log: log.child({ component: "edge-publisher", edge: edgeUrl }),
      facts: () => ({
        replicas: reconciler.table.list(),
        address: (node) => registry.get(node)?.advertiseAddress,
        load: (id, rank, node) => reconciler.runtime.get(`${id}#${rank}@${node}`)?.load,
        staticEndpoints: reconciler.currentConfig.endpoints,
        now: now(),
      }),
    });
    publisher.start(catalog);
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
      log.info("configuration reloaded", { source: next.source, models: nextCatalog.models.length });
    },
    async close() {
      clearInterval(ticker);
      reconciler.stop();
      publisher?.stop();
      intents.close();
      streams.closeAll();
      await Promise.all([closeServer(agentServer), closeServer(adminServer)]);
    },
  };
}

function listen(server: HttpServer | Http2Server, addr: string): Promise<number> {
  const { host, port } = parseListen(addr);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

function closeServer(server: HttpServer | Http2Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    setTimeout(resolve, 2_000).unref();
    if ("closeAllConnections" in server) server.closeAllConnections();
  });
}
