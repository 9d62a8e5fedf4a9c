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
 * bearer secret (`EDGE_SYNC_TOKEN`) compared in constant time. The calls
 * live by what they touch: configuration (edgesync-config.ts), keys
 * (edgesync-keys.ts), the models' pools (edgesync-pools.ts).
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
  const expected = env.EDGE_SYNC_TOKEN;
  if (!expected) return connectError(503, "unavailable", "EdgeSync is disabled: EDGE_SYNC_TOKEN is not set");
  const auth = req.headers.get("authorization") ?? "";
  const m = /^Bearer (\S+)$/.exec(auth);
  if (!m || !(await secretsEqual(m[1]!, expected))) {
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
