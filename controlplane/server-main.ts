import { parseArgs } from "node:util";
import { createLogger, errorMessage } from "../common/log.ts";
import { AdminAuthError } from "./admin/auth.ts";
import { CatalogError } from "./catalog.ts";
import { ConfigError, loadConfig } from "./config/load.ts";
import { ListenError, startControlPlane } from "./server.ts";

const HELP = `usage: llmgw server [--config FILE] [--insecure-admin]

Runs the control plane: agents connect on agent_listen (HTTP/2), operators
and the dashboard on admin_listen (ControlService, /healthz, /metrics).
An empty or missing --config runs on the defaults; LLMGW_ environment
variables override the file (LLMGW_CONTROL__LOST_AFTER=8s).

ControlService needs the admin token from admin.token_file or
$LLMGW_ADMIN_TOKEN. Without one the server refuses an admin_listen other
hosts can reach, unless --insecure-admin accepts that anyone who reaches
it may drain the fleet and create join tokens.
`;

export async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      config: { type: "string", short: "c" },
      "insecure-admin": { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    process.stdout.write(HELP);
    return 0;
  }
  const log = createLogger({ component: "server" });
  let loaded: ReturnType<typeof loadConfig>;
  try {
    loaded = loadConfig(values.config);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      return 1;
    }
    throw err;
  }
  if (loaded.envOverrides.length > 0)
    log.info("environment overrides applied", { keys: loaded.envOverrides });
  let cp: Awaited<ReturnType<typeof startControlPlane>>;
  try {
    cp = await startControlPlane({ loaded, log, insecureAdmin: values["insecure-admin"] ?? false });
  } catch (err) {
    if (err instanceof CatalogError || err instanceof AdminAuthError) {
      process.stderr.write(`${loaded.source}: ${err.message}\n`);
      return 1;
    }
    if (err instanceof ListenError) {
      process.stderr.write(`llmgw server: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  // SIGHUP re-reads the file: new desired state, nothing restarted. A file
  // that no longer validates is refused and the running state kept.
  process.on("SIGHUP", () => {
    try {
      cp.reload(loadConfig(values.config));
    } catch (err) {
      log.error("configuration reload refused; keeping the running configuration", {
        error: errorMessage(err),
      });
    }
  });
  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      log.info("shutting down", { signal });
      resolve();
    };
    process.on("SIGINT", () => stop("SIGINT"));
    process.on("SIGTERM", () => stop("SIGTERM"));
  });
  await cp.close();
  return 0;
}
