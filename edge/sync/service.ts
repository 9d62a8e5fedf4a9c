/**
 * EdgeSync: the control plane's (and the CLI's) way in. Hosted at the
 * Connect paths `/edge.v1.EdgeSyncService/<Method>`, unary only, behind a
 * bearer secret (`EDGE_SYNC_TOKEN`) compared in constant time; during a
 * rotation `EDGE_SYNC_TOKEN_NEXT` is accepted too (docs/edge.md#rotating-the-token).
 * A site's token (`EDGE_SYNC_SITE_TOKENS`) reaches only its own site's
 * endpoint set and load (caller.ts, docs/sites.md).
 * The calls live by what they touch: configuration (config.ts),
 * keys (keys.ts), the models' pools (pools.ts).
 */
import { type DescMessage, fromBinary } from "@bufbuild/protobuf";
import { createConnectRouter } from "@connectrpc/connect";
import {
  universalServerRequestFromFetch,
  universalServerResponseToFetch,
} from "@connectrpc/connect/protocol";
import { EdgeSyncService } from "../../proto/gen/edge/v1/edgesync_pb.ts";
import type { Env } from "../env.ts";
import { callerOf, parseSiteTokens, SITE_METHODS } from "./caller.ts";
import { configCalls } from "./config.ts";
import { keyCalls } from "./keys.ts";
import { poolCalls } from "./pools.ts";

export const EDGESYNC_PREFIX = `/${EdgeSyncService.typeName}/`;

function connectError(
  status: number,
  code: string,
  message: string,
  headers: Record<string, string> = {},
): Response {
  return new Response(JSON.stringify({ code, message }), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

/** Serves one EdgeSync call, or refuses it without revealing anything. */
export async function handleEdgeSync(req: Request, env: Env): Promise<Response> {
  // NEXT alone opens nothing: it is the second token of a rotation, never the only one.
  const current = env.EDGE_SYNC_TOKEN;
  if (!current) return connectError(503, "unavailable", "EdgeSync is disabled: EDGE_SYNC_TOKEN is not set");
  const m = /^Bearer (\S+)$/.exec(req.headers.get("authorization") ?? "");
  let sites = new Map<string, string[]>();
  let sitesBroken = false;
  try {
    sites = parseSiteTokens(env.EDGE_SYNC_SITE_TOKENS);
  } catch (err) {
    // The edge's own token still works, so the operator can fix it from a site.
    console.error(`EdgeSync: site tokens refused: ${(err as Error).message}`);
    sitesBroken = true;
  }
  const caller = m ? await callerOf(m[1]!, [current, env.EDGE_SYNC_TOKEN_NEXT || current], sites) : undefined;
  if (!caller) {
    if (sitesBroken) {
      return connectError(
        503,
        "unavailable",
        "EdgeSync's site tokens (EDGE_SYNC_SITE_TOKENS) do not parse: see the Worker's log",
      );
    }
    return connectError(401, "unauthenticated", "missing or wrong EdgeSync bearer token");
  }
  // Connect answers these two with a bare status and no body; a caller gets a message instead.
  if (req.method !== "POST") {
    return connectError(405, "unimplemented", `EdgeSync takes POST only, not ${req.method.slice(0, 16)}`, {
      allow: "POST",
    });
  }
  if (!UNARY.test(req.headers.get("content-type") ?? "")) {
    return connectError(
      415,
      "invalid_argument",
      "content-type: must be application/json or application/proto",
    );
  }
  const router = createConnectRouter({
    connect: true,
    grpc: false,
    grpcWeb: false,
    readMaxBytes: MAX_REQUEST_BYTES,
  });
  router.service(EdgeSyncService, {
    ...configCalls(env, caller),
    ...keyCalls(env),
    ...poolCalls(env, caller),
  });
  const path = new URL(req.url).pathname;
  const handler = router.handlers.find((h) => h.requestPath === path);
  if (!handler) return connectError(404, "unimplemented", `no such method: ${path}`);
  if (caller.kind === "site" && !SITE_METHODS.has(handler.method.name)) {
    return connectError(
      403,
      "permission_denied",
      `${handler.method.name}: site "${caller.site}"'s token writes only its own endpoint set and load; keys, the catalog and the router settings take the edge's token (EDGE_SYNC_TOKEN)`,
    );
  }
  const checked = await binaryChecked(req, handler.method.input);
  if (checked instanceof Response) return checked;
  const res = await handler(universalServerRequestFromFetch(checked, {}));
  return universalServerResponseToFetch(res);
}

/** Below KV's 25 MiB per value: a document that fits the request fits the store. */
const MAX_REQUEST_BYTES = 16 * 1024 * 1024;
/** Connect's own unary content types (connect-es protocol-connect/content-type.ts). */
const UNARY = /^application\/(?:json(?:; ?charset=utf-?8)?|proto)$/i;

/**
 * connect-es answers a binary request body that does not parse with
 * `internal` (500), as if the fault were the edge's. It is the caller's:
 * such a body is refused here with `invalid_argument`, and a body that
 * parses goes on to Connect as it came.
 */
async function binaryChecked(req: Request, input: DescMessage): Promise<Request | Response> {
  const encoding = req.headers.get("content-encoding");
  const binary = /proto$/i.test(req.headers.get("content-type") ?? "");
  if (!binary || (encoding && encoding !== "identity")) return req;
  if (Number(req.headers.get("content-length") ?? 0) > MAX_REQUEST_BYTES) {
    return connectError(429, "resource_exhausted", `request: larger than ${MAX_REQUEST_BYTES} bytes`);
  }
  const body = new Uint8Array(await req.arrayBuffer());
  try {
    fromBinary(input, body);
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    return connectError(400, "invalid_argument", `request: not a valid ${input.typeName}: ${why}`);
  }
  return new Request(req, { body });
}
