import { join } from "node:path";
import { edgeSyncClient } from "../common/edgesync-client.ts";
import type { Logger } from "../common/log.ts";
import { buildCatalog, type Catalog } from "./catalog.ts";
import { type LoadedConfig, startupGraceMs } from "./config/load.ts";
import { EdgePublisher, PublishedEndpoints } from "./edge-publisher.ts";
import { EdgeStatusPoller } from "./edge-status.ts";
import type { EngineKeyOf } from "./engine-keys.ts";
import type { LoadBoard } from "./load-board.ts";
import type { Reconciler } from "./reconciler.ts";
import type { Registry } from "./registry.ts";
import { StaticCapacity } from "./static-capacity.ts";

/**
 * The edge link (config `edge`), when it has a URL and a secret: catalog,
 * endpoints and load to the Worker, and its pools' status back. Built
 * before the admin API that reads the status; `start` once the reconciler
 * runs.
 */
export function edgeLink(
  loaded: LoadedConfig,
  log: Logger,
  startedAt: number,
  now: () => number,
  registry: Registry,
  reconciler: Reconciler,
  loads: LoadBoard,
  engineKey: EngineKeyOf,
) {
  const { config } = loaded;
  const url = config.edge.url;
  const token = process.env[config.edge.token_env];
  if (!url) {
    log.info("no edge.url: endpoints and load are not published (router-only setups use ctl endpoints set)");
    return undefined;
  }
  if (!token) {
    log.warn("edge.url is set but the EdgeSync secret is not: not publishing to the edge", {
      token_env: config.edge.token_env,
    });
    return undefined;
  }
  const client = edgeSyncClient(url, token);
  const published = new PublishedEndpoints(join(config.data_dir, "llmgw.db"));
  const timeoutMs = () => reconciler.currentConfig.router.scrape_timeout;
  const capacity = new StaticCapacity({
    log: log.child({ component: "static-capacity" }),
    timeoutMs,
    now,
    env: process.env,
  });
  const publisher = new EdgePublisher({
    client,
    log: log.child({ component: "edge-publisher", edge: url }),
    loadRefreshMs: Math.max(1_000, Math.floor(config.router.stale_after / 3)),
    // The hold is for placed replicas whose agents may come back; a
    // router-only fleet (static endpoints alone) has none to wait for.
    ...(buildCatalog(config).controlPlaneMode
      ? {
          graceUntil: startedAt + startupGraceMs(config),
          holdUntil: startedAt + Math.max(startupGraceMs(config), config.control.lost_after),
        }
      : {}),
    store: published,
    site: config.site,
    facts: () => ({
      replicas: reconciler.table.list(),
      address: (node) => registry.get(node)?.advertiseAddress,
      load: (shard) => loads.get(shard),
      staticEndpoints: capacity.apply(reconciler.currentConfig.endpoints),
      via: reconciler.currentConfig.edge.via,
      // What the engine was launched with wins over what this control plane would derive now.
      engineKey: (id, generation, node) =>
        reconciler.launchedKey(id, node, generation) ?? engineKey(id, generation),
      env: process.env,
      now: now(),
    }),
  });
  const status = new EdgeStatusPoller({
    client,
    url,
    intervalMs: config.edge.status_interval,
    log: log.child({ component: "edge-status", edge: url }),
    counters: () => loads.tokenCounters(reconciler.table.list()),
    now,
  });
  return {
    publisher,
    published,
    status,
    client,
    start(catalog: Catalog) {
      void publisher.start(catalog, loaded.routerSection);
      status.start();
    },
  };
}

export type EdgeLink = NonNullable<ReturnType<typeof edgeLink>>;
