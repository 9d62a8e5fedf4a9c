import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import type { Server as HttpServer } from "node:http";
import type { Http2SecureServer, Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { parseListen } from "../common/listen.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import { ownerOnlyDir, ownerOnlyFiles } from "../common/owner-only.ts";
import { MetricsRegistry } from "../common/prometheus.ts";
import { type AdminAuth, loadAdminTokens } from "./admin/auth.ts";
import { adminHostNames, adminListener, setUpAdminAuth } from "./admin-listener.ts";
import { type AgentTls, agentListener, defaultTlsHostnames, setUpAgentTls } from "./agent-listener.ts";
import { AgentStreams } from "./agentsvc/agent-streams.ts";
import { ClaimRefusals } from "./agentsvc/claim-refusals.ts";
import { buildCatalog, type Catalog } from "./catalog.ts";
import { type LoadedConfig, startupGraceMs } from "./config/load.ts";
import { type EdgeLink, edgeLink } from "./edge-link.ts";
import { registerEdgeMetrics } from "./edge-metrics.ts";
import type { EdgeStatusBook } from "./edge-status.ts";
import { type EngineKeys, openEngineKeys } from "./engine-keys.ts";
import { IntentStore } from "./intent-store.ts";
import { KnownFleetStore } from "./known-fleet-store.ts";
import { guardAdminListener } from "./listener/guard.ts";
import { registerListenerMetrics } from "./listener/metrics.ts";
import { LoadBoard } from "./load-board.ts";
import { knownFleet } from "./reconcile/known-fleet.ts";
import { Reconciler } from "./reconciler.ts";
import { Registry } from "./registry.ts";
import { registerScalingMetrics, Scaler } from "./scaler.ts";

export interface ControlPlane {
  readonly agentPort: number;
  readonly adminPort: number;
  readonly registry: Registry;
  readonly streams: AgentStreams;
  readonly reconciler: Reconciler;
  readonly scaler: Scaler;
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

/**
 * `llmgw server`. Each piece is built after the pieces it uses, so the
 * order below is the dependency graph: the registry and the agent streams
 * first; the load board and the reconciler listen to the streams (load to
 * the one, lifecycle to the other) and the reconciler sends its commands
 * through them; the admin API and the edge link read all of it.
 */
export async function startControlPlane(opts: ControlPlaneOptions): Promise<ControlPlane> {
  const { config } = opts.loaded;
  const { log } = opts;
  const now = opts.now ?? Date.now;
  const startedAt = now();
  const c = config.control;
  const registry = newRegistry(config, startedAt);
  const adminAuth = setUpAdminAuth(opts.loaded, log, opts.insecureAdmin ?? false);
  const catalog = checkedCatalog(config, log);
  const intents = new IntentStore(join(config.data_dir, "llmgw.db"));
  const claims = new ClaimRefusals();
  const tls = config.agent_tls.enabled ? await setUpAgentTls(opts.loaded, log, now, claims) : undefined;
  const streams = agentStreams(config, registry, log, now, startedAt, tls, claims);
  const loads = new LoadBoard(streams);
  const known = new KnownFleetStore(join(config.data_dir, "llmgw.db"));
  const engineKeys = openEngineKeys(join(config.data_dir, "llmgw.db"), startedAt);
  // The edge link is built after the reconciler it reads; the scaler asks for its book at each sample.
  let edgeBook: EdgeStatusBook | undefined;
  const scaler = new Scaler({
    log: log.child({ component: "scaler" }),
    edge: () => edgeBook,
    load: (at) => loads.get(at),
  });
  const reconciler = new Reconciler(
    {
      registry,
      streams,
      intents,
      log: log.child({ component: "reconciler" }),
      now,
      scaler,
      engineKey: engineKeys.forReplica,
      retiredKey: engineKeys.isRetired,
      afterPass: () => known.save(knownFleet(reconciler.table.list(), registry.list()), now()),
    },
    config,
    catalog,
  );
  // No node is lost before both the startup grace and lost_after are over.
  awaitKnownFleet(
    known,
    registry,
    reconciler,
    log,
    startedAt + Math.max(startupGraceMs(config), c.lost_after),
  );
  const ticker = watchNodes(registry, reconciler, log, now, c.unreachable_after);
  const revocation = tls && nodeRevocation(tls, registry, streams, reconciler, log, now);
  // A replacing enrollment revokes the node the way an operator would.
  if (tls && revocation) tls.enrollment.revokeNode = (node) => revocation.revoke(node);
  const edge = edgeLink(opts.loaded, log, startedAt, now, registry, reconciler, loads, engineKeys.forReplica);
  const metrics = controlPlaneMetrics(registry, streams, reconciler, adminAuth, tls);
  if (edge) registerEdgeMetrics(metrics, edge.status.book, now);
  edgeBook = edge?.status.book;
  registerScalingMetrics(metrics, scaler, () => reconciler.currentCatalog);
  const agents = agentListener(streams, tls, c.max_message_bytes, log, config.listeners);
  const admin = adminListener({
    control: {
      registry,
      intents,
      reconciler,
      loads,
      scaler,
      now,
      engineKeys,
      ...(edge ? { edgeStatus: edge.status, edgeSync: edge.client } : {}),
      ...(tls ? { joinTokens: tls.enrollment, claims } : {}),
      ...(revocation ? { revocation } : {}),
    },
    auth: adminAuth,
    hosts: adminHostNames(opts.loaded),
    metrics,
    log,
    now,
  });
  registerListenerMetrics(metrics, [agents.guard, guardAdminListener(admin, config.listeners, log)]);

  // Every store has opened the database by now, so its WAL files exist too.
  const db = join(config.data_dir, "llmgw.db");
  ownerOnlyFiles([db, `${db}-wal`, `${db}-shm`], log);
  const shutdown = () =>
    stopAll({ ticker, agents, reconciler, edge, intents, known, engineKeys, tls, streams, admin });
  const { agentPort, adminPort } = await listenBoth(agents.server, admin, config, shutdown);
  announceAgentListener(tls, config, log);
  reconciler.start();
  edge?.start(catalog);
  log.info("control plane listening", { agentPort, adminPort, config: opts.loaded.source });

  return {
    agentPort,
    adminPort,
    registry,
    streams,
    reconciler,
    scaler,
    reload: (next) =>
      reload(next, { adminAuth, reconciler, edge, streams, log, site: opts.loaded.config.site }),
    close: shutdown,
  };
}

/** Everything started stopped, every store closed: timers, listeners, the edge link, the streams. */
async function stopAll(parts: {
  ticker: ReturnType<typeof setInterval>;
  agents: ReturnType<typeof agentListener>;
  reconciler: Reconciler;
  edge: EdgeLink | undefined;
  intents: IntentStore;
  known: KnownFleetStore;
  engineKeys: EngineKeys;
  tls: AgentTls | undefined;
  streams: AgentStreams;
  admin: HttpServer | Http2Server | Http2SecureServer;
}): Promise<void> {
  const { ticker, agents, reconciler, edge, intents, known, engineKeys, tls, streams, admin } = parts;
  clearInterval(ticker);
  agents.stop();
  reconciler.stop();
  edge?.publisher.stop();
  edge?.status.stop();
  edge?.published.close();
  intents.close();
  known.close();
  engineKeys.close();
  tls?.tokens.close();
  tls?.certs.close();
  streams.closeAll();
  await Promise.all([closeServer(agents.server), closeServer(admin)]);
}

function newRegistry(config: LoadedConfig["config"], startedAt: number): Registry {
  const c = config.control;
  return new Registry(
    {
      unreachableAfterMs: c.unreachable_after,
      lostAfterMs: c.lost_after,
      startupGraceMs: startupGraceMs(config),
      lostFreezeFraction: c.lost_freeze_fraction,
    },
    startedAt,
  );
}

/** The catalog, its warnings logged; the data directory (and its pki/) made the owner's alone. */
function checkedCatalog(config: LoadedConfig["config"], log: Logger): Catalog {
  const catalog = buildCatalog(config);
  for (const w of catalog.warnings) log.warn("catalog warning", { warning: w });
  ownerOnlyDir(config.data_dir, log);
  if (existsSync(join(config.data_dir, "pki"))) ownerOnlyDir(join(config.data_dir, "pki"), log);
  return catalog;
}

function agentStreams(
  config: LoadedConfig["config"],
  registry: Registry,
  log: Logger,
  now: () => number,
  startedAt: number,
  tls: AgentTls | undefined,
  claims: ClaimRefusals,
): AgentStreams {
  const c = config.control;
  return new AgentStreams({
    registry,
    log: log.child({ component: "agentsvc" }),
    controlPlaneId: randomUUID(),
    epoch: BigInt(startedAt),
    heartbeatIntervalMs: c.heartbeat_interval,
    scrape: { intervalMs: config.router.scrape_interval, timeoutMs: config.router.scrape_timeout },
    readMaxBytes: c.max_message_bytes,
    now,
    ...(tls
      ? { certificates: tls.certs, claims, renew: (cert, csrPem) => tls.enrollment.renew(cert, csrPem) }
      : {}),
  });
}

/** Both listeners bound, or neither left running. */
async function listenBoth(
  agents: HttpServer | Http2Server | Http2SecureServer,
  admin: HttpServer | Http2Server | Http2SecureServer,
  config: LoadedConfig["config"],
  shutdown: () => Promise<void>,
): Promise<{ agentPort: number; adminPort: number }> {
  try {
    const agentPort = await listen(agents, "agent_listen", config.agent_listen);
    const adminPort = await listen(admin, "admin_listen", config.admin_listen);
    return { agentPort, adminPort };
  } catch (err) {
    // A control plane half up — agents connected, operators locked out — is
    // worse than none: whatever started stops, and the caller exits.
    await shutdown();
    throw err;
  }
}

function announceAgentListener(tls: AgentTls | undefined, config: LoadedConfig["config"], log: Logger): void {
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
}

/** SIGHUP: the new configuration's tokens, catalog, router settings and scrape settings; listeners and timers stay. */
function reload(
  next: LoadedConfig,
  parts: {
    adminAuth: AdminAuth;
    reconciler: Reconciler;
    edge: EdgeLink | undefined;
    streams: AgentStreams;
    log: Logger;
    /** The site this control plane started with. */
    site: string;
  },
): void {
  const { adminAuth, reconciler, edge, streams, log } = parts;
  reloadAdminTokens(adminAuth, next, log);
  if (next.config.site !== parts.site) {
    log.warn("site: read at start only; keeping the site this control plane started with", {
      running: parts.site,
      file: next.config.site,
    });
  }
  const nextCatalog = buildCatalog(next.config);
  reconciler.reload(next.config, nextCatalog);
  edge?.publisher.setCatalog(nextCatalog);
  edge?.publisher.setRouterSettings(next.routerSection);
  streams.setScrape({
    intervalMs: next.config.router.scrape_interval,
    timeoutMs: next.config.router.scrape_timeout,
  });
  log.info("configuration reloaded", { source: next.source, models: nextCatalog.models.length });
}

/**
 * The nodes and replicas the last control plane knew, taken back before the
 * first pass: a node whose agent is slower to return than the startup grace
 * keeps its replicas (and its place in `ctl status`) until it registers or
 * `lost_after` from this start makes it lost.
 */
function awaitKnownFleet(
  known: KnownFleetStore,
  registry: Registry,
  reconciler: Reconciler,
  log: Logger,
  lostNotBefore: number,
): void {
  const { fleet, error } = known.load();
  if (error) log.warn("the fleet known before this start is unreadable: awaiting no node", { error });
  for (const n of fleet.nodes) registry.expect(n, registry.startedAt);
  reconciler.table.restore(fleet.replicas, registry.startedAt);
  if (fleet.nodes.length > 0)
    log.info("awaiting the nodes that held replicas before this start", {
      nodes: fleet.nodes.map((n) => n.name),
      replicas: fleet.replicas.length,
      lostNotBefore: new Date(lostNotBefore).toISOString(),
    });
}

/**
 * Advances every node's lifecycle on a timer and wakes the reconciler on a
 * change. A resolution well under a second keeps the observed transition
 * times close to the configured ones without a timer per node.
 */
function watchNodes(
  registry: Registry,
  reconciler: Reconciler,
  log: Logger,
  now: () => number,
  unreachableAfterMs: number,
): NodeJS.Timeout {
  let frozenLogged = false;
  const every = Math.max(100, Math.min(1_000, Math.floor(unreachableAfterMs / 10)));
  return setInterval(() => {
    for (const t of registry.tick(now())) {
      log.info("node state changed", { ...t });
      reconciler.trigger(`${t.node} ${t.to}`);
    }
    if (registry.lostFrozen !== frozenLogged) {
      frozenLogged = registry.lostFrozen;
      if (frozenLogged)
        log.warn(
          "more than half of the fleet is unreachable: not declaring any node lost",
          registry.counts(),
        );
      else log.info("lost-freeze lifted", registry.counts());
    }
  }, every);
}

/** `ctl nodes revoke`: the node's certificates, its stream, and its place in the fleet. */
function nodeRevocation(
  tls: AgentTls,
  registry: Registry,
  streams: AgentStreams,
  reconciler: Reconciler,
  log: Logger,
  now: () => number,
) {
  return {
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
}

function controlPlaneMetrics(
  registry: Registry,
  streams: AgentStreams,
  reconciler: Reconciler,
  adminAuth: AdminAuth,
  tls: AgentTls | undefined,
): MetricsRegistry {
  const metrics = new MetricsRegistry();
  const byLabel = (label: string, counts: Record<string, number>) =>
    Object.entries(counts).map(([value, n]) => ({ labels: { [label]: value }, value: n }));
  metrics.gauge("llmgw_nodes", "Nodes by lifecycle state.", () => byLabel("state", registry.counts()));
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
    byLabel("reason", streams.stats.rejected),
  );
  if (tls) {
    const e = tls.enrollment;
    metrics.counter(
      "llmgw_agent_enrollments_total",
      "Enroll calls and certificate renewals, by result.",
      () => [
        { labels: { result: "enrolled" }, value: e.stats.enrolled },
        { labels: { result: "renewed" }, value: e.stats.renewed },
        ...byLabel("result", e.stats.refused),
      ],
    );
  }
  metrics.counter("llmgw_admin_auth_failures_total", "ControlService calls refused, by reason.", () =>
    byLabel("reason", adminAuth.failures),
  );
  metrics.counter(
    "llmgw_admin_token_reloads_total",
    "Re-reads of the admin tokens on SIGHUP, by result (loaded, refused: the current ones kept).",
    () => byLabel("result", adminAuth.reloads),
  );
  metrics.gauge("llmgw_replicas", "Replicas in the table.", () => reconciler.table.size);
  metrics.gauge(
    "llmgw_replicas_outdated",
    "Replicas running an older spec than their profile's, by model: a rollout under way, or waiting for room.",
    () => {
      const outdated = reconciler.outdated();
      return reconciler.currentCatalog.models
        .filter((m) => !m.routerOnly)
        .map((m) => ({
          labels: { model: m.name },
          value: outdated.filter((o) => o.replica.model === m.name).length,
        }));
    },
  );
  metrics.counter("llmgw_reconcile_passes_total", "Reconcile passes run.", () => reconciler.passes);
  metrics.gauge(
    "llmgw_reconcile_last_pass_seconds",
    "Duration of the last reconcile pass.",
    () => reconciler.lastPassMs / 1000,
  );
  metrics.gauge("process_resident_memory_bytes", "Resident set size.", () => process.memoryUsage().rss);
  metrics.gauge("nodejs_heap_used_bytes", "V8 heap in use.", () => process.memoryUsage().heapUsed);
  metrics.gauge(
    "nodejs_external_memory_bytes",
    "Memory held outside the V8 heap (buffers, native).",
    () => process.memoryUsage().external,
  );
  return metrics;
}

/**
 * A token file is read again on reload, so a token can be rotated without a
 * restart (add the new line, move clients over, remove the old one).
 */
function reloadAdminTokens(auth: AdminAuth, next: LoadedConfig, log: Logger): void {
  try {
    const { tokens, source } = loadAdminTokens(next.config.admin);
    if (auth.enabled && tokens.length === 0) {
      auth.reloads.refused++;
      log.error("admin token reload refused: the new configuration has none; keeping the current one(s)");
    } else {
      auth.setTokens(tokens);
      auth.reloads.loaded++;
      if (tokens.length > 0) log.info("admin tokens loaded", { source, tokens: tokens.length });
    }
  } catch (err) {
    auth.reloads.refused++;
    log.error("admin token reload refused; keeping the current one(s)", { error: errorMessage(err) });
  }
}

/** A listener that could not bind (its port taken, its address not this host's): the server exits. */
export class ListenError extends Error {}

function listen(
  server: HttpServer | Http2Server | Http2SecureServer,
  key: string,
  addr: string,
): Promise<number> {
  const { host, port } = parseListen(addr);
  return new Promise((resolve, reject) => {
    const fail = (err: NodeJS.ErrnoException) => {
      const why =
        err.code === "EADDRINUSE"
          ? "the port is already in use (another llmgw server, or another program?)"
          : err.code === "EADDRNOTAVAIL"
            ? "the address is not one of this host's"
            : err.message;
      reject(new ListenError(`${key} ${addr}: ${why} (${err.code ?? "error"})`));
    };
    server.once("error", fail);
    server.listen(port, host, () => {
      server.off("error", fail);
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
