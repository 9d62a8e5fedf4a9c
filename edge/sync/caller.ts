/**
 * Who is calling EdgeSync (docs/sites.md#tokens): the edge's own token
 * (`EDGE_SYNC_TOKEN`, or `EDGE_SYNC_TOKEN_NEXT` during a rotation), which
 * may do everything, or a site's token from `EDGE_SYNC_SITE_TOKENS`, which
 * writes only that site's endpoint set and load and reads the pools'
 * status. Keys, the catalog and the router settings stay the edge's.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { z } from "zod";
import { formatPath } from "../../common/zod-issues.ts";
import { DEFAULT_SITE, siteNameSchema } from "../config/site-sets.ts";
import { secretsEqual } from "../keys/auth.ts";
import { invalid } from "./errors.ts";

export type Caller = { kind: "edge" } | { kind: "site"; site: string };

/** What a site's token may call; anything else is the edge's token's. */
export const SITE_METHODS = new Set(["PutEndpointSets", "PushLoad", "GetPoolStatus", "GetRouterSettings"]);

/** Long enough that guessing is out of the question (`openssl rand -hex 32` gives 64). */
const tokenSchema = z.string().min(16, "a site token: at least 16 characters");

/** `{"eu": "TOKEN", "us": ["NEW", "OLD"]}`: two tokens for a site while its token is rotated. */
const siteTokensSchema = z.record(
  z.string(),
  z.preprocess(
    (v) => (typeof v === "string" ? [v] : v),
    z
      .array(tokenSchema, "a token, or a list of two while it is rotated")
      .min(1, "at least one token")
      .max(2, "at most two tokens: the new one and the old one"),
  ),
  'an object of site names to tokens: {"SITE": "TOKEN", …}',
);

export class SiteTokensError extends Error {}

/** The site tokens a Worker var holds, by site; a var that does not parse is an error naming what to fix. */
export function parseSiteTokens(raw: string | undefined): Map<string, string[]> {
  if (!raw) return new Map();
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new SiteTokensError('EDGE_SYNC_SITE_TOKENS: not JSON; expected {"SITE": "TOKEN", …}');
  }
  const r = siteTokensSchema.safeParse(json);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const at = issue.path.length > 0 ? `.${formatPath(issue.path)}` : "";
    throw new SiteTokensError(`EDGE_SYNC_SITE_TOKENS${at}: ${issue.message}`);
  }
  for (const site of Object.keys(r.data)) {
    const name = siteNameSchema.safeParse(site);
    if (!name.success)
      throw new SiteTokensError(
        `EDGE_SYNC_SITE_TOKENS: "${site.slice(0, 64)}": ${name.error.issues[0]!.message}`,
      );
  }
  return new Map(Object.entries(r.data));
}

/**
 * The caller a bearer token stands for, or undefined when it is none of
 * them. Every token is compared, so the time taken says nothing of which
 * one matched.
 */
export async function callerOf(
  presented: string,
  edge: readonly string[],
  sites: ReadonlyMap<string, readonly string[]>,
): Promise<Caller | undefined> {
  const candidates: { token: string; caller: Caller }[] = [
    ...edge.map((token) => ({ token, caller: { kind: "edge" } as const })),
    ...[...sites].flatMap(([site, tokens]) =>
      tokens.map((token) => ({ token, caller: { kind: "site", site } as const })),
    ),
  ];
  const equal = await Promise.all(candidates.map((c) => secretsEqual(presented, c.token)));
  // The edge's token first: a site given the edge's own token by mistake is the edge.
  const i = equal.indexOf(true);
  return i < 0 ? undefined : candidates[i]!.caller;
}

/**
 * The site a write names, checked against the caller: empty means the
 * caller's own site (the default one for the edge's token). A site token
 * naming another site is refused, and so is a name that is not one.
 */
export function siteOfWrite(caller: Caller, named: string, what: string): string {
  if (caller.kind === "site") {
    if (named && named !== caller.site) {
      throw new ConnectError(
        `site: this token is site "${caller.site}"'s, and cannot write site "${named.slice(0, 64)}"'s ${what}`,
        Code.PermissionDenied,
      );
    }
    return caller.site;
  }
  const r = siteNameSchema.safeParse(named || DEFAULT_SITE);
  if (!r.success) throw invalid(`site: ${r.error.issues[0]!.message}`);
  return r.data;
}
