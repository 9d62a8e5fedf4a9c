/**
 * Where a request entered Cloudflare: `request.cf`'s continent, country and
 * colo, which `router.sites` maps to an ordered site preference
 * (docs/sites.md). Local runs (wrangler dev, Miniflare) carry no real `cf`:
 * Miniflare hands every request the same one (its machine's, or a fallback
 * in Texas). So when the Worker's `LLMGW_LOCATION_HEADER` is "1"
 * (`npm start -- --sites N` and the tests set it) the header replaces `cf`
 * altogether, and a request without it has no location. Deployed, leave it
 * unset: a client must not choose the site it is sent to.
 */
import { z } from "zod";
import { errors } from "./openai-errors.ts";
import type { Location } from "./routing/types.ts";

export const LOCATION_HEADER = "x-llmgw-location";

const cfSchema = z.object({
  continent: z.string().optional(),
  country: z.string().optional(),
  colo: z.string().optional(),
});

/** `EU`, `EU/DE` or `EU/DE/FRA`: continent, then country, then colo. */
const headerSchema = z
  .string()
  .regex(/^[A-Z]{2}(\/[A-Z]{2}(\/[A-Z]{3})?)?$/, "continent[/country[/colo]], as EU, EU/DE or EU/DE/FRA");

export function requestLocation(req: Request, headerEnabled: string | undefined): Location | undefined {
  if (headerEnabled === "1") {
    const raw = req.headers.get(LOCATION_HEADER);
    if (raw === null) return undefined;
    const h = headerSchema.safeParse(raw.trim());
    if (!h.success)
      throw errors.invalid(`${LOCATION_HEADER}: ${h.error.issues[0]!.message}`, LOCATION_HEADER);
    const [continent, country, colo] = h.data.split("/");
    return { continent, country, colo };
  }
  const cf = cfSchema.safeParse((req as { cf?: unknown }).cf);
  if (!cf.success) return undefined;
  const { continent, country, colo } = cf.data;
  return continent || country || colo ? { continent, country, colo } : undefined;
}
