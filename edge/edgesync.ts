import { createConnectRouter } from "@connectrpc/connect";
import {
  universalServerRequestFromFetch,
  universalServerResponseToFetch,
} from "@connectrpc/connect/protocol";
import { EdgeSyncService } from "../proto/gen/edge/v1/edgesync_pb.ts";
import { secretsEqual } from "./auth.ts";
import { configCalls } from "./edgesync-config.ts";
import { keyCalls } from "./edgesync-keys.ts";
import { poolCalls } from "./edgesync-pools.ts";
import type { Env } from "./env.ts";

/**
 * EdgeSync: the control plane's (and the CLI's) way in. Hosted at the
 * Connect paths `/edge.v1.EdgeSyncService/<Method>`, unary only, behind a
 * bearer secret (`EDGE_SYNC_TOKEN`) compared in constant time; during a
 * rotation `EDGE_SYNC_TOKEN_NEXT` is accepted too (docs/edge.md#rotating-the-token).
 * The calls live by what they touch: configuration (edgesync-config.ts),
 * keys (edgesync-keys.ts), the models' pools (edgesync-pools.ts).
 */
export const EDGESYNC_PREFIX = `/${EdgeSyncService.typeName}/`;

function connectError(status: number, code: string, message: string): Response {
  return new Response(JSON.stringify({ code, message }), {
    status,
    headers: { "content-type": "application/json" },
  });
}

/** Serves one EdgeSync call, or refuses it without revealing anything. */
export async function handleEdgeSync(req: Request, env: Env): Promise<Response> {
  // NEXT alone opens nothing: it is the second token of a rotation, never the only one.
  const current = env.EDGE_SYNC_TOKEN;
  if (!current) return connectError(503, "unavailable", "EdgeSync is disabled: EDGE_SYNC_TOKEN is not set");
  const m = /^Bearer (\S+)$/.exec(req.headers.get("authorization") ?? "");
  if (!m || !(await tokenAccepted(m[1]!, current, env.EDGE_SYNC_TOKEN_NEXT))) {
    return connectError(401, "unauthenticated", "missing or wrong EdgeSync bearer token");
  }
  const router = createConnectRouter({ connect: true, grpc: false, grpcWeb: false });
  router.service(EdgeSyncService, { ...configCalls(env), ...keyCalls(env), ...poolCalls(env) });
  const path = new URL(req.url).pathname;
  const handler = router.handlers.find((h) => h.requestPath === path);
  if (!handler) return connectError(404, "unimplemented", `no such method: ${path}`);
  const res = await handler(universalServerRequestFromFetch(req, {}));
  return universalServerResponseToFetch(res);
}

/** Both tokens are always compared, so the time taken says nothing of which one matched. */
async function tokenAccepted(presented: string, current: string, next: string | undefined): Promise<boolean> {
  const [a, b] = await Promise.all([
    secretsEqual(presented, current),
    secretsEqual(presented, next || current),
  ]);
  return a || b;
}
