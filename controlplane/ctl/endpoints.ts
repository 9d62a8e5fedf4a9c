import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { ConnectError } from "@connectrpc/connect";
import { parseDocument } from "yaml";
import { z } from "zod";
import { errorMessage } from "../../common/log.ts";
import { formatIssues } from "../../common/zod-issues.ts";
import { poolPriorityConflicts } from "../../edge/catalog.ts";
import { endpointSchema } from "../config/schema.ts";
import { DEFAULT_EDGE, edgeSyncClient } from "../edgesync-client.ts";

/**
 * `llmgw ctl endpoints set FILE`: router-only mode. A YAML list of engines
 * (id, url, models, pool, weight, priority, optionally via) is validated
 * here with path-named errors and written straight to the edge, with no
 * control plane involved — how a user points llmgw at engines they run by
 * hand.
 */
export const endpointsFileSchema = z
  .array(endpointSchema.extend({ via: z.enum(["direct", "vpc", "tunnel"]).default("direct") }))
  .superRefine((list, ctx) => {
    const seen = new Map<string, number>();
    list.forEach((e, i) => {
      const first = seen.get(e.id);
      if (first !== undefined) {
        ctx.addIssue({ code: "custom", path: [i, "id"], message: `duplicate id (also endpoints[${first}])` });
      } else seen.set(e.id, i);
    });
    for (const c of poolPriorityConflicts(list)) {
      ctx.addIssue({ code: "custom", path: [c.index, "priority"], message: c.message });
    }
  });
export type EndpointsFile = z.output<typeof endpointsFileSchema>;

/** Parses and validates the file; throws one message listing every problem by path. */
export function parseEndpointsFile(text: string, source: string): EndpointsFile {
  const doc = parseDocument(text);
  if (doc.errors.length > 0) throw new Error(`${source}: ${doc.errors.map((e) => e.message).join("; ")}`);
  let raw = doc.toJS() as unknown;
  // Either a bare list or `endpoints: [...]`, the same key as the config file.
  if (raw && typeof raw === "object" && !Array.isArray(raw) && "endpoints" in raw) {
    raw = (raw as { endpoints: unknown }).endpoints;
  }
  const r = endpointsFileSchema.safeParse(raw ?? []);
  if (!r.success) {
    const issues = formatIssues(r.error).map((i) => (i.startsWith("[") ? `endpoints${i}` : i));
    throw new Error(`${source}: invalid endpoints:\n${issues.map((i) => `  - ${i}`).join("\n")}`);
  }
  return r.data;
}

const HELP = `usage: llmgw ctl endpoints set FILE [--edge URL] [--version N]
       llmgw ctl endpoints check FILE

FILE is a YAML list of endpoints: id, url, models, pool, weight, priority, via.
--edge defaults to ${DEFAULT_EDGE}; the EdgeSync secret is read from $LLMGW_EDGE_TOKEN.
`;

export async function main(argv: string[]): Promise<number | undefined> {
  const [command, ...rest] = argv;
  if (!command || command === "help" || command === "--help" || command === "-h") {
    process.stdout.write(HELP);
    return command ? 0 : 2;
  }
  const { values, positionals } = parseArgs({
    args: rest,
    allowPositionals: true,
    options: { edge: { type: "string" }, version: { type: "string" } },
  });
  const file = positionals[0];
  if ((command !== "set" && command !== "check") || !file) {
    process.stderr.write(HELP);
    return 2;
  }
  let endpoints: EndpointsFile;
  try {
    endpoints = parseEndpointsFile(readFileSync(file, "utf8"), file);
  } catch (err) {
    process.stderr.write(`${errorMessage(err)}\n`);
    return 1;
  }
  if (command === "check") {
    process.stdout.write(`${file}: ${endpoints.length} endpoints OK\n`);
    return 0;
  }
  const edge = values.edge ?? process.env.LLMGW_EDGE_URL ?? DEFAULT_EDGE;
  try {
    const res = await edgeSyncClient(edge).putEndpointSets({
      endpoints,
      version: values.version ? BigInt(values.version) : 0n,
    });
    process.stdout.write(`wrote ${endpoints.length} endpoints to ${edge} (version ${res.version})\n`);
    return 0;
  } catch (err) {
    const msg = err instanceof ConnectError ? err.rawMessage : errorMessage(err);
    process.stderr.write(`llmgw ctl endpoints set: ${msg} (edge ${edge})\n`);
    return 1;
  }
}
