import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ControlService } from "../../proto/gen/control/v1/control_pb.ts";

export const DEFAULT_CONTROL_PLANE = "http://127.0.0.1:9090";

export function controlClient(baseUrl: string): Client<typeof ControlService> {
  return createClient(ControlService, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
}
