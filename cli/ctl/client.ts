import { readFileSync } from "node:fs";
import type { Client } from "@connectrpc/connect";
import { bearerClient } from "../../common/edgesync-client.ts";
import { ControlService } from "../../proto/gen/control/v1/control_pb.ts";

export const DEFAULT_CONTROL_PLANE = "http://127.0.0.1:9090";

/**
 * The admin token for ControlService: the first line of `--token-file`, else
 * $LLMGW_ADMIN_TOKEN. Never a command-line argument, which every user of the
 * host could read in `ps`.
 */
export function adminToken(
  tokenFile: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): string | undefined {
  if (tokenFile) {
    const line = readFileSync(tokenFile, "utf8")
      .split("\n")
      .map((l) => l.trim())
      .find((l) => l !== "" && !l.startsWith("#"));
    if (!line) throw new Error(`--token-file ${tokenFile} holds no token`);
    return line;
  }
  return env.LLMGW_ADMIN_TOKEN?.trim() || undefined;
}

export function controlClient(baseUrl: string, token?: string): Client<typeof ControlService> {
  return bearerClient(ControlService, baseUrl, token);
}
