import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { ControlService } from "../../proto/gen/control/v1/control_pb.ts";
import type { Registry } from "../registry.ts";
import { type NodeIntent, nodeToProto } from "./nodes.ts";

/** What the operator API reads; the server wires the live objects in. */
export interface ControlServiceDeps {
  registry: Registry;
  intent?: (node: string) => NodeIntent;
}

export function controlRoutes(deps: ControlServiceDeps) {
  const intent = deps.intent ?? (() => ({ cordoned: false, draining: false }));
  return (router: ConnectRouter) => {
    router.service(ControlService, {
      listNodes: () => ({ nodes: deps.registry.list().map((n) => nodeToProto(n, intent(n.name))) }),
      getNode: (req) => {
        const n = deps.registry.get(req.name);
        if (!n)
          throw new ConnectError(`node "${req.name}" is not known to this control plane`, Code.NotFound);
        return { node: nodeToProto(n, intent(n.name)) };
      },
    });
  };
}
