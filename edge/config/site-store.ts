/**
 * Which sites have an endpoint set in KV (docs/sites.md): the index
 * `config/sites` names every site but the default one, whose set is always
 * read. A site is added the first time it writes its set.
 *
 * KV has no transactions, and two sites that write their first set within
 * KV's propagation time (up to a minute deployed) can each write an index
 * without the other. So the index is only ever added to, and a site checks
 * that it is still named whenever it pushes load (every second or so,
 * edge/sync/pools.ts): a name lost to that race is back within a push.
 */
import { z } from "zod";
import { siteNameSchema } from "./site-sets.ts";
import { readStored } from "./stored-doc.ts";

export const SITE_INDEX_KEY = "config/sites";

const siteIndexSchema = z.object({ sites: z.array(siteNameSchema) });

/** The sites the index names; an index that does not parse names none (the default site's set is read regardless). */
export async function readSiteIndex(kv: KVNamespace): Promise<string[]> {
  return (await readStored(kv, SITE_INDEX_KEY, siteIndexSchema))?.sites ?? [];
}

/** Adds `site` to the index unless KV already names it there. Whether it wrote. */
export async function ensureSiteIndexed(kv: KVNamespace, site: string): Promise<boolean> {
  const sites = await readSiteIndex(kv);
  if (sites.includes(site)) return false;
  await kv.put(SITE_INDEX_KEY, JSON.stringify({ sites: [...sites, site].sort() }));
  return true;
}
