import { type ParseArgsConfig, parseArgs } from "node:util";
import { ConnectError } from "@connectrpc/connect";
import { errorMessage } from "../../common/log.ts";

type Options = NonNullable<ParseArgsConfig["options"]>;

/**
 * The opening every `llmgw ctl`/`keys` command shares: the subcommand comes
 * first; none, or help, prints the usage and ends with the exit code (2
 * when no command was given, 0 when help was asked for); then its flags.
 */
export function openCommand<const O extends Options>(argv: readonly string[], help: string, options: O) {
  const [command, ...args] = argv;
  if (!command || command === "help" || command === "--help" || command === "-h") {
    process.stdout.write(help);
    return command ? 0 : 2;
  }
  return { command, ...parseArgs({ args, allowPositionals: true, options }) };
}

/** The flags every command that talks to the edge takes. */
export const EDGE_FLAGS = { edge: { type: "string" }, json: { type: "boolean" } } as const;

/** Why a call failed, for the operator: the server's own words when it answered. */
export function failure(err: unknown): string {
  return err instanceof ConnectError ? err.rawMessage : errorMessage(err);
}
