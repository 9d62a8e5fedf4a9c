import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { EdgeSyncService, PoolStatusSchema } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import { DEFAULT_SITE, qualifiedId } from "../config/site-sets.ts";
import { ensureSiteIndexed } from "../config/site-store.ts";
import { edgeConfig } from "../config/store.ts";
import type { Env } from "../env.ts";
import { poolOf } from "../pool/client.ts";
import type { LoadUpdate, PoolStatus } from "../routing/pool-core.ts";
import type { LoadSample } from "../routing/types.ts";
import { type Caller, siteOfWrite } from "./caller.ts";

/**
 * EdgeSync's live calls, both straight to the models' pools and never to
 * KV (minutes-stale, one write a second): load snapshots in, pool status
 * out. A site's loads reach only that site's endpoints (docs/sites.md).
 */
type PoolCalls = Pick<ServiceImpl<typeof EdgeSyncService>, "pushLoad" | "getPoolStatus">;

type PoolStatusInit = MessageInitShape<typeof PoolStatusSchema>;

const STATES = new Set<LoadSample["state"]>(["ready", "draining", "down"]);

export function poolCalls(env: Env, caller: Caller): PoolCalls {
  return {
    async pushLoad(req) {
      const site = siteOfWrite(caller, req.site, "load");
      const config = await edgeConfig(env);
      const { table } = config;
      // A site's first write to the index can be lost to another's (site-store.ts): put it back.
      if (site !== DEFAULT_SITE && !config.siteVersions.has(site)) {
        await ensureSiteIndexed(env.LLMGW_KV, site);
      }
      const now = Date.now();
      const byModel = new Map<string, LoadUpdate[]>();
      for (const l of req.loads) {
        const id = qualifiedId(site, l.endpointId);
        // Another site's endpoint is as unknown to this site's loads as an id no site has.
        if ((table.siteOfEndpoint(id) ?? DEFAULT_SITE) !== site) continue;
        const models = table.modelsOfEndpoint(id);
        if (models.length === 0) continue;
        const scraped = Number(l.scrapedAtUnixMs);
        const update: LoadUpdate = {
          endpoint: id,
          sample: {
            waiting: finite(l.waiting),
            running: finite(l.running),
            kvUsage: Math.min(1, finite(l.kvUsage)),
            prefixCacheHitRate: Math.min(1, finite(l.prefixCacheHitRate)),
            at: scraped > 0 ? scraped : now,
            state: STATES.has(l.state as LoadSample["state"]) ? (l.state as LoadSample["state"]) : "ready",
          },
        };
        for (const m of models) {
          const list = byModel.get(m) ?? [];
          list.push(update);
          byModel.set(m, list);
        }
      }
      await Promise.all([...byModel].map(([m, updates]) => poolOf(env, m).pushLoad(m, updates)));
      return {};
    },

    async getPoolStatus(req) {
      const { table } = await edgeConfig(env);
      const named = req.model ? table.resolve(req.model) : undefined;
      // Asking a pool is what creates it: none for a name the edge does not know.
      if (req.model && !named)
        throw new ConnectError(`model: no model "${req.model.slice(0, 256)}" at the edge`, Code.NotFound);
      const models = named ? [named] : table.modelNames();
      const pools = await Promise.all(
        models.map(async (m): Promise<PoolStatusInit> => {
          try {
            return toMessage(await poolOf(env, m).status(m));
          } catch (err) {
            return { model: m, error: err instanceof Error ? err.message : String(err) };
          }
        }),
      );
      return { pools };
    },
  };
}

/** Negative or non-finite numbers from a broken scrape count as 0, never as a reason to crash. */
function finite(v: number): number {
  return Number.isFinite(v) && v > 0 ? v : 0;
}

function toMessage(s: PoolStatus): PoolStatusInit {
  return {
    model: s.model,
    endpointsVersion: BigInt(s.endpointsVersion),
    saturation: s.saturation ?? -1,
    loadFeed: s.loadFeed,
    leases: s.leases,
    sessions: s.sessions,
    failOpens: BigInt(s.failOpens),
    calls: BigInt(s.calls),
    grants: {
      outstanding: s.grants.outstanding,
      issued: BigInt(s.grants.issued),
      used: BigInt(s.grants.used),
      late: BigInt(s.grants.late),
      returned: BigInt(s.grants.returned),
      expired: BigInt(s.grants.expired),
    },
    estimatedRequests: BigInt(s.estimated.requests),
    estimatedTokens: BigInt(s.estimated.tokens),
    bands: s.bands.map((b) => ({
      name: b.name,
      ceiling: b.ceiling,
      depth: b.depth,
      admitted: BigInt(b.admitted),
      queued: BigInt(b.queued),
      full: BigInt(b.full),
      expired: BigInt(b.expired),
      abandoned: BigInt(b.abandoned),
      noEndpoints: BigInt(b.noEndpoints),
      noCapacity: BigInt(b.noCapacity),
    })),
    routes: Object.fromEntries(Object.entries(s.routes).map(([k, v]) => [k, BigInt(v)])),
    endpoints: s.endpoints.map((e) => ({
      id: e.id,
      site: e.site,
      url: e.url,
      pool: e.pool,
      priority: e.priority,
      weight: e.weight,
      state: e.state,
      inflight: e.inflight,
      reserved: e.reserved,
      saturation: e.saturation,
      breaker: e.breaker,
      breakerReason: e.breakerReason ?? "",
      loadAgeMs: BigInt(e.loadAgeMs ?? -1),
      waiting: e.waiting ?? 0,
      running: e.running ?? 0,
      kvUsage: e.kvUsage ?? 0,
      prefixBlocks: e.prefixBlocks,
      tokens: BigInt(Math.round(e.tokens)),
      prefilling: e.prefilling,
      maxNumSeqs: e.maxSeqs ?? 0,
      kvTokens: BigInt(e.kvTokens ?? 0),
    })),
    lastRejections: s.lastRejections,
    sites: (s.sites ?? []).map((p) => ({
      ...p,
      version: BigInt(p.version),
      routed: BigInt(p.routed),
      routedLastMinute: BigInt(p.routedLastMinute),
    })),
  };
}
