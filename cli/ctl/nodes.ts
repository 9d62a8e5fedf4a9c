import type { Client } from "@connectrpc/connect";
import { type GpuInfo, inventoryFromProto } from "../../common/inventory.ts";
import { type ControlService, type Node, NodeState } from "../../proto/gen/control/v1/control_pb.ts";
import { ago, renderTable } from "./table.ts";

/** The shape `llmgw ctl nodes --json` promises scripts; keep it stable. */
export interface NodeJson {
  name: string;
  state: "ready" | "unreachable" | "lost" | "unknown";
  since: string;
  lastSeen: string;
  registeredAt: string;
  connected: boolean;
  /** Its certificates were revoked and it has not enrolled again. */
  revoked: boolean;
  /** ISO time of the revocation; "" when not revoked. */
  revokedAt: string;
  cordoned: boolean;
  draining: boolean;
  /** ISO time a drain stops what is left on the node; "" when not draining. */
  drainDeadline: string;
  /** Held replicas before a control plane restart and has not registered since. */
  awaitingReconnect: boolean;
  agentVersion: string;
  agentInstance: string;
  advertiseAddress: string;
  fabric: Record<string, string>;
  simulated: boolean;
  cpuCores: number;
  ramTotalMiB: number;
  gpus: GpuInfo[];
  /** The last refused attempt on this name (mTLS): who tried, when, why. */
  lastRefusedClaim: { at: string; reason: string; from: string; serial: string } | null;
}

const STATE_NAME: Record<number, NodeJson["state"]> = {
  [NodeState.READY]: "ready",
  [NodeState.UNREACHABLE]: "unreachable",
  [NodeState.LOST]: "lost",
};

const iso = (ms: bigint) => (ms > 0n ? new Date(Number(ms)).toISOString() : "");

export function nodeJson(n: Node): NodeJson {
  const inv = inventoryFromProto(n.inventory);
  return {
    name: n.name,
    state: STATE_NAME[n.state] ?? "unknown",
    since: iso(n.stateSinceUnixMs),
    lastSeen: iso(n.lastSeenUnixMs),
    registeredAt: iso(n.registeredAtUnixMs),
    connected: n.connected,
    revoked: n.revokedAtUnixMs > 0n,
    revokedAt: iso(n.revokedAtUnixMs),
    cordoned: n.cordoned,
    draining: n.draining,
    drainDeadline: n.draining ? iso(n.drainDeadlineUnixMs) : "",
    awaitingReconnect: n.awaitingReconnect,
    agentVersion: n.agentVersion,
    agentInstance: n.agentInstance,
    advertiseAddress: n.advertiseAddress,
    fabric: { ...n.fabric },
    simulated: inv.simulated,
    cpuCores: inv.cpuCores,
    ramTotalMiB: inv.ramTotalMiB,
    gpus: inv.gpus,
    lastRefusedClaim: n.lastRefusedClaim
      ? {
          at: iso(n.lastRefusedClaim.atUnixMs),
          reason: n.lastRefusedClaim.reason,
          from: n.lastRefusedClaim.from,
          serial: n.lastRefusedClaim.serial,
        }
      : null,
  };
}

/** `8 × H100 80GB (612 GiB free)`; mixed nodes list each model. */
export function gpuSummary(n: NodeJson): string {
  if (n.gpus.length === 0) return "none";
  const byName = new Map<string, number>();
  for (const g of n.gpus) byName.set(g.name, (byName.get(g.name) ?? 0) + 1);
  const free = n.gpus.reduce((s, g) => s + g.memoryFreeMiB, 0) / 1024;
  const models = [...byName].map(([name, count]) => `${count}×${name.replace(/^NVIDIA /, "")}`).join(", ");
  return `${models}, ${Math.round(free)} GiB free`;
}

export async function nodesCommand(client: Client<typeof ControlService>, json: boolean): Promise<string> {
  const { nodes } = await client.listNodes({});
  const rows = nodes.map(nodeJson);
  return json ? `${JSON.stringify(rows, null, 2)}\n` : nodesTable(rows);
}

/** A drain's deadline, as far off as it is: what is left on the node is stopped then. */
function drainNote(n: NodeJson, now: number): string {
  const deadline = Date.parse(n.drainDeadline);
  if (!(deadline > 0)) return "draining";
  if (deadline <= now) return "draining, deadline passed";
  // ago() words a span back from now; the deadline is as far ahead.
  return `draining, deadline in ${ago(now - (deadline - now), now)}`;
}

export function nodesTable(rows: readonly NodeJson[], now = Date.now()): string {
  if (rows.length === 0) return "no nodes have registered\n";
  return nodeRows(rows, now) + refusedClaims(rows, now);
}

/** Below the table: who last tried to take a node's name and was refused. */
function refusedClaims(rows: readonly NodeJson[], now: number): string {
  const lines = rows.flatMap((n) => {
    const c = n.lastRefusedClaim;
    if (!c) return [];
    const serial = c.serial ? `, certificate serial ${c.serial}` : "";
    return [`  ${n.name}: ${c.reason} from ${c.from}${serial}, ${ago(Date.parse(c.at), now)} ago\n`];
  });
  return lines.length > 0 ? `\nrefused claims on node names:\n${lines.join("")}` : "";
}

function nodeRows(rows: readonly NodeJson[], now: number): string {
  return renderTable(
    ["NODE", "STATE", "SINCE", "GPUS", "FABRIC", "AGENT", "LAST SEEN"],
    rows.map((n) => [
      n.name + (n.draining ? ` (${drainNote(n, now)})` : n.cordoned ? " (cordoned)" : ""),
      n.revoked ? "revoked" : n.awaitingReconnect ? "awaiting reconnect" : n.state,
      ago(Date.parse(n.revoked ? n.revokedAt : n.since), now),
      gpuSummary(n),
      Object.entries(n.fabric)
        .map(([k, v]) => `${k}=${v}`)
        .join(",") || "-",
      n.agentVersion,
      n.lastSeen ? `${ago(Date.parse(n.lastSeen), now)} ago` : "-",
    ]),
  );
}
