import { type Client, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { EdgeSyncService } from "../proto/gen/edge/v1/edgesync_pb.ts";

/**
 * A client of the Worker's EdgeSync service, for the control plane's
 * publisher and the `llmgw keys` / `ctl endpoints` commands alike. The token
 * defaults to LLMGW_EDGE_TOKEN.
 */
export const DEFAULT_EDGE = "http://127.0.0.1:8787";
export type EdgeSyncClient = Client<typeof EdgeSyncService>;

export function edgeSyncClient(baseUrl: string, token = process.env.LLMGW_EDGE_TOKEN ?? ""): EdgeSyncClient {
  const auth: Interceptor = (next) => (req) => {
    if (token) req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  // HTTP/1.1 and unary calls: what a Worker can serve.
  return createClient(
    EdgeSyncService,
    createConnectTransport({ baseUrl, httpVersion: "1.1", interceptors: [auth] }),
  );
}
