import { errorMessage, logLevelProblem } from "../common/log.ts";

/**
 * One binary, many roles. Each subcommand lives beside the part it runs and
 * is loaded only when asked for, so `llmgw sim-engine` does not pay for the
 * control plane's modules, and a thousand agents start quickly.
 */
type Main = (argv: string[]) => Promise<number | undefined> | number | undefined;

const COMMANDS: Record<string, { help: string; load: () => Promise<{ main: Main }> }> = {
  server: { help: "run the control plane", load: () => import("../controlplane/server-main.ts") },
  agent: { help: "run a node agent", load: () => import("../agent/main.ts") },
  ctl: { help: "operate a running control plane", load: () => import("./ctl/main.ts") },
  "sim-engine": {
    help: "a CPU stand-in for vLLM (or SGLang: -m sglang.launch_server)",
    load: () => import("../sim-engine/main.ts"),
  },
  keys: { help: "manage API keys at the edge", load: () => import("./ctl/keys.ts") },
  bench: {
    help: "load-test an OpenAI-compatible URL (edge or engine)",
    load: () => import("../loadgen/main.ts"),
  },
  config: {
    help: "check a configuration file or print its schema",
    load: () => import("../controlplane/config/cli.ts"),
  },
};

function usage(): string {
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(12)} ${c.help}`);
  return `usage: llmgw <command> [flags]\n\ncommands:\n${lines.join("\n")}\n`;
}

async function run(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(usage());
    return name ? 0 : 2;
  }
  const command = COMMANDS[name];
  if (!command) {
    process.stderr.write(`llmgw: unknown command "${name}"\n\n${usage()}`);
    return 2;
  }
  const problem = logLevelProblem();
  if (problem) {
    process.stderr.write(`llmgw: ${problem}\n`);
    return 2;
  }
  const mod = await command.load();
  return (await mod.main(rest)) ?? 0;
}

run(process.argv.slice(2)).then(
  (code) => {
    if (code !== 0) process.exitCode = code;
  },
  (err) => {
    process.stderr.write(`llmgw: ${errorMessage(err)}\n`);
    process.exitCode = 1;
  },
);
