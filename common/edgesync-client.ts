import type { DescService } from "@bufbuild/protobuf";
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
  // HTTP/1.1 and unary calls: what a Worker can serve.
  return bearerClient(EdgeSyncService, baseUrl, token);
}

/** The edge `--edge` names, else $LLMGW_EDGE_URL, else the local one. */
export function edgeUrl(flag: string | undefined): string {
  return flag ?? process.env.LLMGW_EDGE_URL ?? DEFAULT_EDGE;
}

/** A client of `service` over HTTP/1.1 that sends `token` (when there is one) as a bearer token. */
export function bearerClient<S extends DescService>(
  service: S,
  baseUrl: string,
  token: string | undefined,
): Client<S> {
  const auth: Interceptor = (next) => (req) => {
    if (token) req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  return createClient(service, createConnectTransport({ baseUrl, httpVersion: "1.1", interceptors: [auth] }));
}
