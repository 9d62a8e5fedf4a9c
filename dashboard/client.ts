import { type Client, Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { ControlService } from "../proto/gen/control/v1/control_pb.ts";

/** ControlService from the browser (docs/architecture.md, the control path): the page's own origin, the admin token as a bearer token. */
export type Control = Client<typeof ControlService>;

export function controlClient(token: string): Control {
  const auth: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  return createClient(
    ControlService,
    createConnectTransport({ baseUrl: location.origin, interceptors: [auth] }),
  );
}

export const isUnauthenticated = (err: unknown): boolean =>
  ConnectError.from(err).code === Code.Unauthenticated;

/** The server's own words, without Connect's `[code]` prefix. */
export const errorText = (err: unknown): string => ConnectError.from(err).rawMessage;
