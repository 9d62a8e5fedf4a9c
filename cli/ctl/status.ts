import { type JsonObject, toJson } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import {
  type ControlService,
  type GetEdgeStatusResponse,
  GetEdgeStatusResponseSchema,
} from "../../proto/gen/control/v1/control_pb.ts";
import { formatPools } from "./endpoints.ts";
import { type NodeJson, nodeJson, nodesTable } from "./nodes.ts";
import {
  type ModelJson,
  modelJson,
  modelsTable,
  type ReplicaJson,
  replicaJson,
  replicasTable,
} from "./replicas.ts";
import { siteRows, sitesTable } from "./sites.ts";
import { ago } from "./table.ts";

/**
 * `llmgw ctl status`: the fleet on one screen — nodes, replicas, models
 * (with `ctl explain`'s words for the replicas that cannot run) and the
 * edge's view as the control plane last polled it.
 */
export interface Status {
  nodes: NodeJson[];
  replicas: ReplicaJson[];
  models: (ModelJson & { cannotRun: string[] })[];
  edge: GetEdgeStatusResponse;
}

export async function fetchStatus(client: Client<typeof ControlService>): Promise<Status> {
  const [nodes, replicas, models, edge] = await Promise.all([
    client.listNodes({}),
    client.listReplicas({}),
    client.listModels({}),
    client.getEdgeStatus({}),
  ]);
  return {
    nodes: nodes.nodes.map(nodeJson),
    replicas: replicas.replicas.map(replicaJson),
    models: await Promise.all(
      models.models.map(async (m) => {
        const short = !m.routerOnly && m.replicasReady < m.replicasDesired;
        return {
          ...modelJson(m),
          cannotRun: short ? unplaced((await client.explain({ model: m.name })).lines) : [],
        };
      }),
    ),
    edge,
  };
}

/**
 * The blocks of `ctl explain`'s lines (a headline, then indented detail)
 * for replicas that are not placed; a placed one's headline says "placed:",
 * and the scaling block ("scaling: …") is about the model, not a replica.
 */
export function unplaced(lines: readonly string[]): string[] {
  const blocks: string[][] = [];
  for (const l of lines) {
    if (!l.startsWith(" ") || blocks.length === 0) blocks.push([l]);
    else blocks.at(-1)!.push(l);
  }
  return blocks.filter((b) => !/^\S+ placed: /.test(b[0]!) && !b[0]!.startsWith("scaling: ")).flat();
}

/**
 * `--json`: the same four parts, the edge's without its 15-minute history
 * (GetEdgeStatus has it), and the SITES table's rows (empty for an edge of
 * one site).
 */
export function statusJson(s: Status): Record<string, unknown> {
  const edge = toJson(GetEdgeStatusResponseSchema, s.edge) as JsonObject;
  for (const m of (edge.models ?? []) as JsonObject[]) delete m.history;
  return { nodes: s.nodes, replicas: s.replicas, models: s.models, edge, sites: siteRows(pools(s.edge)) };
}

const pools = (e: GetEdgeStatusResponse) => e.models.flatMap((m) => (m.pool ? [m.pool] : []));

export function formatStatus(s: Status, now = Date.now()): string {
  const out = [
    `NODES\n${nodesTable(s.nodes, now)}`,
    `REPLICAS\n${replicasTable(s.replicas, now)}`,
    `MODELS\n${modelsTable(s.models)}`,
  ];
  for (const m of s.models) {
    if (m.cannotRun.length > 0)
      out.push(`${m.name}: ${m.replicasReady}/${m.replicasDesired} ready\n${indent(m.cannotRun)}`);
  }
  // Sites before the pools' detail: which site serves how much is the first question with two.
  const sites = siteRows(pools(s.edge));
  if (sites.length > 0) out.push(`SITES (each model's pool at the edge)\n${sitesTable(sites)}`);
  out.push(`EDGE ${edgeHeadline(s.edge, now)}\n${s.edge.configured ? formatPools(pools(s.edge)) : ""}`);
  return out.join("\n");
}

function edgeHeadline(e: GetEdgeStatusResponse, now: number): string {
  if (!e.configured) return "not polled: the control plane has no edge.url or no EdgeSync secret";
  const polled =
    e.lastSuccessAtUnixMs > 0n
      ? `polled ${ago(Number(e.lastSuccessAtUnixMs), now)} ago`
      : "not polled successfully yet";
  const failed = e.lastError
    ? `; last poll failed ${ago(Number(e.lastErrorAtUnixMs), now)} ago: ${e.lastError}`
    : "";
  return `${e.edgeUrl}: ${polled}, every ${e.pollIntervalMs / 1000}s${failed}`;
}

const indent = (lines: readonly string[]) => `${lines.map((l) => `  ${l}`).join("\n")}\n`;
