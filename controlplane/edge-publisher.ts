/**
 * Control plane → edge (docs/architecture.md, the control and load paths):
 * the catalog, the endpoint set and live load, through the Worker's EdgeSync
 * service. The endpoint set is every ready replica (its rank 0, the only
 * rank that serves HTTP) plus the static endpoints of the config; it is
 * written only when it changes, because the edge stores it in KV (one write
 * a second per key, minutes to propagate). The router settings (the config's
 * `router:` section) go once per start or reload. Load goes to the models'
 * pools instead, batched at least a second apart, for endpoints whose
 * numbers moved and, every `loadRefreshMs`, for the rest: a pool takes
 * silence for a lost feed.
 *
 * Each control plane publishes its own site's set and load (`site:`,
 * docs/sites.md). Holding a site's token rather than the edge's, it may not
 * publish the catalog or the router settings: the edge refuses those with
 * `permission_denied`, and they are left to whoever holds the edge's token.
 *
 * A restarted control plane knows no replica until agents report them, so
 * for a while after its start it must not shrink what the edge routes to: it
 * publishes the set it last published (kept in SQLite), minus only the
 * replicas an agent has since reported not serving, plus what is new. The
 * while (`holdUntil`) is the startup grace or `lost_after`, whichever is
 * longer: a node not heard from since the start is then in the position of
 * one silent for that long, whose replicas are kept until it is lost. With
 * nothing stored (a first start) it does not know what the edge has and
 * publishes no endpoint set during the startup grace, in which nothing is
 * placed anyway.
 */

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { EdgeSyncClient } from "../common/edgesync-client.ts";
import { errorMessage, type Logger } from "../common/log.ts";
import { type EnvLookup, staticEndpointIn } from "../common/static-endpoint.ts";
import type { ShardLoad } from "../proto/gen/agent/v1/agent_pb.ts";
import {
  type Endpoint,
  EndpointLoadSchema,
  EndpointSchema,
  PutEndpointSetsRequestSchema,
} from "../proto/gen/edge/v1/edgesync_pb.ts";
import type { Catalog } from "./catalog.ts";
import type { EndpointConfig } from "./config/schema.ts";
import type { ShardAt } from "./load-board.ts";
import { OneRowStore } from "./one-row-store.ts";
import { replicaStatus } from "./reconcile/table.ts";
import type { ReplicaRecord } from "./reconcile/types.ts";

export interface EdgeFacts {
  replicas: readonly ReplicaRecord[];
  address: (node: string) => string | undefined;
  load: (shard: ShardAt) => ShardLoad | undefined;
  staticEndpoints: readonly EndpointConfig[];
  /** How the edge reaches the replicas placed here (config `edge.via`). */
  via: EndpointConfig["via"];
  /** Where a static endpoint's `api_key_env` is read (process.env); absent, no key is. */
  env?: EnvLookup;
  /** The key the engine of a replica's rank 0 on `node` requires; without it, none is sent. */
  engineKey?: (replicaId: string, generation: number, node: string) => string;
  now: number;
}

/** Pure: the endpoint set the edge should have now. */
export function endpointSet(f: EdgeFacts): Endpoint[] {
  const out: Endpoint[] = f.staticEndpoints.map(staticEndpointIn(f.env ?? {}));
  for (const r of f.replicas) {
    if (replicaStatus(r, f.now) !== "ready") continue;
    const head = r.shards.find((s) => s.rank === 0);
    const host = head && f.address(head.node);
    if (!head || !host || head.ports.http === 0) continue;
    // Capacity as the agent read it off the engine (its arguments, its
    // cache_config_info); unknown until the first scrape after ready.
    const load = f.load({ replicaId: r.id, rank: 0, node: head.node });
    out.push(
      create(EndpointSchema, {
        id: r.id,
        url: `http://${host.includes(":") ? `[${host}]` : host}:${head.ports.http}`,
        models: [r.model],
        pool: "default",
        weight: 1,
        priority: 0,
        via: f.via,
        maxNumSeqs: load?.maxNumSeqs ?? 0,
        kvTokens: load?.kvCapacityTokens ?? 0n,
        apiKey: f.engineKey?.(r.id, r.generation, head.node) ?? "",
      }),
    );
  }
  return out.sort((a, b) => a.id.localeCompare(b.id));
}

const fingerprint = (list: readonly Endpoint[]) =>
  JSON.stringify(
    list.map((e) => [
      e.id,
      e.url,
      e.models,
      e.pool,
      e.weight,
      e.priority,
      e.via,
      e.maxNumSeqs,
      String(e.kvTokens),
      e.servedModelName,
      e.apiKey,
    ]),
  );

/**
 * Pure: what to publish while holding after a start. `last` is what the edge
 * was last given. An endpoint of `last` stays unless an agent has reported
 * its replica since the start (the replica has shards), or this control
 * plane has known it since (`known`: it published it, or held it, and has
 * since stopped and forgotten it, as a scale-down or a rollout does), in
 * which case the current set decides; an id in both takes the current entry.
 */
export function graceSet(
  current: readonly Endpoint[],
  last: readonly Endpoint[],
  f: EdgeFacts,
  known: ReadonlySet<string> = new Set(),
): Endpoint[] {
  const ids = new Set(current.map((e) => e.id));
  const reported = new Set(f.replicas.filter((r) => r.shards.length > 0).map((r) => r.id));
  const kept = last.filter((e) => !ids.has(e.id) && !reported.has(e.id) && !known.has(e.id));
  return [...current, ...kept].sort((a, b) => a.id.localeCompare(b.id));
}

/** The endpoint set last published, in `data_dir/llmgw.db`, so a restarted control plane knows what the edge has. */
export class PublishedEndpoints {
  private readonly row: OneRowStore<Uint8Array>;

  constructor(path: string) {
    this.row = new OneRowStore(path, {
      table: "edge_endpoint_set",
      column: "endpoints",
      type: "BLOB",
      writtenAt: "published_at",
    });
  }

  /**
   * Undefined when nothing was ever published from this data_dir; an error
   * names a stored set that does not decode (it is then as if none was).
   */
  load(): { endpoints: Endpoint[] | undefined; error?: string } {
    const blob = this.row.read();
    if (blob === undefined) return { endpoints: undefined };
    try {
      return { endpoints: fromBinary(PutEndpointSetsRequestSchema, blob).endpoints };
    } catch (err) {
      return { endpoints: undefined, error: `edge_endpoint_set does not decode: ${errorMessage(err)}` };
    }
  }

  save(endpoints: readonly Endpoint[], now: number): void {
    this.row.write(
      toBinary(
        PutEndpointSetsRequestSchema,
        create(PutEndpointSetsRequestSchema, { endpoints: [...endpoints] }),
      ),
      now,
    );
  }

  close(): void {
    this.row.close();
  }
}

export interface EdgePublisherOptions {
  client: EdgeSyncClient;
  log: Logger;
  facts: () => EdgeFacts;
  /** How often to look for changes; load is never pushed more often. */
  intervalMs?: number;
  /**
   * An endpoint's load is pushed again after this long even if its numbers
   * did not move, so the pool can tell a quiet engine from a lost feed: a
   * third of the edge's `stale_after`.
   */
  loadRefreshMs: number;
  /** Unix ms the startup grace ends: with nothing stored, no endpoint set before then. */
  graceUntil?: number;
  /** Unix ms until which the edge's set only changes as graceSet says (see above). */
  holdUntil?: number;
  /** Where the last published set is kept across restarts. */
  store?: Pick<PublishedEndpoints, "load" | "save">;
  /** The site whose set and load this control plane publishes (config `site:`); default "default". */
  site?: string;
}

export class EdgePublisher {
  private timer: NodeJS.Timeout | undefined;
  private published = "";
  private catalogPending = true;
  private catalog: Catalog | undefined;
  private routerPending = false;
  private router: Record<string, unknown> = {};
  private readonly lastLoad = new Map<string, { key: string; at: number }>();
  private busy = false;
  /** What the edge was last given (this run or, from the store, the one before). */
  private last: Endpoint[] | undefined;
  /** Ids this control plane has routed or seen running since its start: for those, its own set decides. */
  private readonly known = new Set<string>();
  private heldLogged = false;
  failures = 0;
  endpointWrites = 0;
  loadPushes = 0;

  constructor(private readonly opts: EdgePublisherOptions) {}

  /** Publishes at once and then every interval; the promise is the first publication's. */
  start(catalog: Catalog, routerSection: Record<string, unknown>): Promise<void> {
    const stored = this.opts.store?.load();
    if (stored?.error)
      this.opts.log.warn(
        "the endpoint set last published is unreadable: as if none was, the edge's is left as it is during the startup grace",
        {
          error: stored.error,
        },
      );
    this.last = stored?.endpoints;
    this.setCatalog(catalog);
    this.setRouterSettings(routerSection);
    this.timer = setInterval(() => void this.tick(), this.opts.intervalMs ?? 1_000);
    return this.tick();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  setCatalog(catalog: Catalog): void {
    this.catalog = catalog;
    this.catalogPending = true;
  }

  /** The config file's `router:` section; the edge validates it and fills in its defaults. */
  setRouterSettings(section: Record<string, unknown>): void {
    this.router = section;
    this.routerPending = true;
  }

  async tick(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    const { client, log } = this.opts;
    try {
      if (this.catalogPending && this.catalog) {
        const catalog = this.catalog;
        const done = await this.edgeOwned("catalog", () =>
          client.putCatalog({
            models: catalog.models.map((m) => ({
              name: m.name,
              aliases: [...m.aliases],
              fallbacks: [...m.fallbacks],
              routing: m.routing,
            })),
          }),
        );
        this.catalogPending = false;
        if (done) log.info("catalog published to the edge", { models: catalog.models.length });
      }
      if (this.routerPending) {
        const settingsJson = JSON.stringify(this.router);
        const done = await this.edgeOwned("router settings", () =>
          client.putRouterSettings({ settingsJson }),
        );
        this.routerPending = false;
        if (done) log.info("router settings published to the edge", { version: String(done.version) });
      }
      const facts = this.opts.facts();
      const endpoints = this.toPublish(facts);
      const fp = endpoints && fingerprint(endpoints);
      if (endpoints && fp !== this.published) {
        // The edge refuses an empty set without allow_empty. One computed
        // here after the startup hold is this control plane's own view of
        // its fleet, so it says that it means it.
        const { version } = await client.putEndpointSets({
          endpoints,
          allowEmpty: endpoints.length === 0,
          site: this.site,
        });
        this.published = fp!;
        this.last = endpoints;
        this.opts.store?.save(endpoints, facts.now);
        this.endpointWrites++;
        log.info("endpoint set published to the edge", {
          version: String(version),
          endpoints: endpoints.length,
          site: this.site,
        });
      }
      await this.pushLoad(facts);
      if (this.failures > 0) log.info("edge reachable again", { afterFailures: this.failures });
      this.failures = 0;
    } catch (err) {
      // Keep trying: the edge may be deploying, or the network between us
      // down. Engines keep serving meanwhile; only freshness suffers.
      if (this.failures++ % 30 === 0)
        log.warn("edge sync failed", { error: errorMessage(err), failures: this.failures });
    } finally {
      this.busy = false;
    }
  }

  private get site(): string {
    return this.opts.site ?? "default";
  }

  /**
   * A call only the edge's own token may make. With a site's token the edge
   * refuses it; that is said once, not retried as a failure. Undefined then.
   */
  private async edgeOwned<T>(what: string, call: () => Promise<T>): Promise<T | undefined> {
    try {
      return await call();
    } catch (err) {
      if (!(err instanceof ConnectError) || err.code !== Code.PermissionDenied) throw err;
      this.opts.log.info(
        `${what} not published: this control plane holds site ${this.site}'s token, and the ${what} are the edge's (published with the edge's token)`,
        {
          edge: err.rawMessage,
        },
      );
      return undefined;
    }
  }

  /** The set to give the edge now; undefined: leave the edge's as it is. */
  private toPublish(f: EdgeFacts): Endpoint[] | undefined {
    const current = endpointSet(f);
    if (!this.last) {
      const until = this.opts.graceUntil;
      if (until === undefined || f.now >= until) return current;
      if (!this.heldLogged) {
        this.heldLogged = true;
        this.opts.log.info(
          "no endpoint set published from this data_dir before: leaving the edge's as it is during the startup grace",
          { forMs: until - f.now },
        );
      }
      return undefined;
    }
    const until = this.opts.holdUntil;
    if (until === undefined || f.now >= until) return current;
    const held = graceSet(current, this.last, f, this.known);
    for (const e of current) this.known.add(e.id);
    for (const r of f.replicas) if (r.shards.length > 0) this.known.add(r.id);
    return held;
  }

  private async pushLoad(f: EdgeFacts): Promise<void> {
    const loads = [];
    for (const r of f.replicas) {
      const head = r.shards.find((s) => s.rank === 0);
      if (!head) continue;
      const l = f.load({ replicaId: r.id, rank: 0, node: head.node });
      if (!l) continue;
      const state = head.state === "ready" ? "ready" : head.state === "draining" ? "draining" : "down";
      const key = `${l.waiting}/${l.running}/${l.kvUsage.toFixed(3)}/${l.prefixCacheHitRate.toFixed(3)}/${state}`;
      const last = this.lastLoad.get(r.id);
      if (last?.key === key && f.now - last.at < this.opts.loadRefreshMs) continue;
      this.lastLoad.set(r.id, { key, at: f.now });
      loads.push(
        create(EndpointLoadSchema, {
          endpointId: r.id,
          waiting: l.waiting,
          running: l.running,
          kvUsage: l.kvUsage,
          prefixCacheHitRate: l.prefixCacheHitRate,
          scrapedAtUnixMs: l.scrapedAtUnixMs,
          state,
        }),
      );
    }
    if (loads.length === 0) return;
    await this.opts.client.pushLoad({ loads, site: this.site });
    this.loadPushes++;
  }
}
