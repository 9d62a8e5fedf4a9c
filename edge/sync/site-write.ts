/**
 * EdgeSync `PutEndpointSets` for one site (docs/sites.md): the set is
 * checked against the caller and the other sites, stored under the site's
 * own key at the site's own version, and handed to the pool of every model
 * the site's old or new set names. Other sites' sets are not touched.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import {
  catalogDocSchema,
  EMPTY_CATALOG,
  EMPTY_ENDPOINTS,
  type EndpointRecord,
  endpointSpec,
  RoutingTable,
} from "../config/catalog.ts";
import { DEFAULT_SITE, idCollisions, qualifiedId, unionOf } from "../config/site-sets.ts";
import { ensureSiteIndexed } from "../config/site-store.ts";
import { CATALOG_KEY, endpointsKey, invalidateEdgeConfig, readDoc, readSiteSets } from "../config/store.ts";
import type { Env } from "../env.ts";
import { poolOf } from "../pool/client.ts";
import { type Caller, siteOfWrite } from "./caller.ts";
import { invalid, nextVersion } from "./errors.ts";

/** The site's new version. Refuses (and changes nothing) on a wrong site, an id another site has, an unmeant empty set or an old version. */
export async function putSiteSet(
  env: Env,
  caller: Caller,
  req: { site: string; version: bigint; allowEmpty: boolean },
  endpoints: EndpointRecord[],
): Promise<number> {
  const kv = env.LLMGW_KV;
  const site = siteOfWrite(caller, req.site, "endpoint set");
  const [catalog, sets] = await Promise.all([
    readDoc(kv, CATALOG_KEY, catalogDocSchema, EMPTY_CATALOG),
    readSiteSets(kv, site),
  ]);
  const old = sets.get(site) ?? EMPTY_ENDPOINTS;
  if (endpoints.length === 0 && old.endpoints.length > 0 && !req.allowEmpty) {
    const of = site === DEFAULT_SITE ? "" : ` of site "${site}"`;
    throw new ConnectError(
      `endpoints: empty, and would remove all ${old.endpoints.length} endpoints${of} of version ${old.version}; set allow_empty (llmgw ctl endpoints set --allow-empty) if that is meant`,
      Code.FailedPrecondition,
    );
  }
  const clash = idCollisions(sets, site, endpoints)[0];
  if (clash) throw invalid(`endpoints[${clash.index}].id: ${clash.message}`);
  const version = nextVersion(old.version, req.version);
  await kv.put(endpointsKey(site), JSON.stringify({ version, endpoints }));
  if (site !== DEFAULT_SITE) await ensureSiteIndexed(kv, site);
  invalidateEdgeConfig();

  const before = new RoutingTable(catalog, unionOf(sets));
  const afterSets = new Map(sets).set(site, { version, endpoints });
  const after = new RoutingTable(catalog, unionOf(afterSets));
  const models = new Set(
    [...old.endpoints, ...endpoints].flatMap((e) => {
      const id = qualifiedId(site, e.id);
      return [...before.modelsOfEndpoint(id), ...after.modelsOfEndpoint(id)];
    }),
  );
  // Best effort: a pool that misses this hears of the version from the
  // next Worker that has read it, and reads KV itself.
  await Promise.all(
    [...models].map((m) =>
      poolOf(env, m)
        .setSiteEndpoints(
          m,
          site,
          version,
          after
            .endpointsFor(m)
            .filter((e) => after.siteOfEndpoint(e.id) === site)
            .map(endpointSpec),
        )
        .catch((err) => console.error("endpoint set not handed to pool", m, err)),
    ),
  );
  return version;
}
