import type { ControlService } from "../../proto/gen/control/v1/control_pb.ts";

/**
 * Who may do what on the admin listener, as one table (docs/security.md):
 * every ControlService call and /metrics, each either `token` — the admin
 * token only — or `read_only_network`: also open to `admin.read_only_networks`
 * without one. Only what reads the fleet (nodes, replicas, models, explain)
 * is opened; key usage and the edge's view come from the edge and name
 * every key, so they need the token. A call added to control.proto must be
 * added here, or this file does not compile.
 */
export type Access = "token" | "read_only_network";

export type AdminDoor = keyof (typeof ControlService)["method"] | "/metrics";

export const ADMIN_ACCESS = {
  listNodes: "read_only_network",
  getNode: "read_only_network",
  listReplicas: "read_only_network",
  listModels: "read_only_network",
  explain: "read_only_network",
  "/metrics": "read_only_network",
  cordon: "token",
  uncordon: "token",
  drain: "token",
  createJoinToken: "token",
  revokeNode: "token",
  rotateEngineKeys: "token",
  getEdgeStatus: "token",
  getKeyUsage: "token",
} as const satisfies Record<AdminDoor, Access>;

/** Whether `door` opens to read_only_networks; anything not in the table does not. */
export function opensToReadOnlyNetworks(door: string): boolean {
  return (ADMIN_ACCESS as Record<string, Access>)[door] === "read_only_network";
}
