import { parseArgs } from "node:util";
import { ConnectError } from "@connectrpc/connect";
import { errorMessage } from "../../common/log.ts";
import { controlClient, DEFAULT_CONTROL_PLANE } from "./client.ts";
import { nodeJson, nodesCommand } from "./nodes.ts";

const HELP = `usage: llmgw ctl <command> [--control-plane URL] [--json]

commands:
  nodes                 nodes with state, GPUs, fabric labels and last heartbeat
  node NAME             one node in full (JSON)
  endpoints set FILE    write a static endpoint list to the edge (router-only mode)

--control-plane defaults to ${DEFAULT_CONTROL_PLANE} (or $LLMGW_CONTROL_PLANE).
`;

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (!command || command === "help" || command === "--help" || command === "-h") {
    process.stdout.write(HELP);
    return command ? 0 : 2;
  }
  if (command === "endpoints") {
    const mod = await import("./endpoints.ts");
    return (await mod.main(rest)) ?? 0;
  }
  const { values, positionals } = parseArgs({
    args: rest,
    allowPositionals: true,
    options: {
      "control-plane": { type: "string" },
      json: { type: "boolean" },
    },
  });
  const url = values["control-plane"] ?? process.env.LLMGW_CONTROL_PLANE ?? DEFAULT_CONTROL_PLANE;
  const client = controlClient(url);
  try {
    switch (command) {
      case "nodes":
        process.stdout.write(await nodesCommand(client, values.json ?? false));
        return 0;
      case "node": {
        const name = positionals[0];
        if (!name) throw new Error("usage: llmgw ctl node NAME");
        const { node } = await client.getNode({ name });
        process.stdout.write(`${JSON.stringify(node ? nodeJson(node) : null, null, 2)}\n`);
        return 0;
      }
      default:
        process.stderr.write(`llmgw ctl: unknown command "${command}"\n\n${HELP}`);
        return 2;
    }
  } catch (err) {
    const msg = err instanceof ConnectError ? err.rawMessage : errorMessage(err);
    process.stderr.write(`llmgw ctl ${command}: ${msg} (control plane ${url})\n`);
    return 1;
  }
}
