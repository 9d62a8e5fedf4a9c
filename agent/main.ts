import { randomUUID } from "node:crypto";
import { mkdirSync } from "node:fs";
import { createLogger, errorMessage } from "../common/log.ts";
import pkg from "../package.json" with { type: "json" };
import { AGENT_HELP, type AgentFlags, parseAgentFlags } from "./flags.ts";
import { type InventorySource, nvidiaSmiInventory, simulatedInventory } from "./inventory.ts";
import { buildRegister } from "./register-message.ts";
import { StreamClient } from "./stream-client.ts";

export async function main(argv: string[]): Promise<number> {
  let flags: AgentFlags | "help";
  try {
    flags = parseAgentFlags(argv);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n\n${AGENT_HELP}`);
    return 2;
  }
  if (flags === "help") {
    process.stdout.write(AGENT_HELP);
    return 0;
  }
  const f = flags;
  const instance = randomUUID();
  const log = createLogger({ component: "agent", node: f.node });
  let inventory: InventorySource;
  try {
    inventory = f.simulateGpus
      ? simulatedInventory(f.node, f.simulateGpus, f.simulateForeign)
      : nvidiaSmiInventory(f.nvidiaSmi);
  } catch (err) {
    process.stderr.write(`llmgw agent: ${errorMessage(err)}\n`);
    return 2;
  }
  mkdirSync(f.stateDir, { recursive: true });
  if (f.simulateGpus) log.warn("GPUs are simulated", { spec: f.simulateGpus });

  const client = new StreamClient({
    url: f.controlPlane,
    log,
    pingIntervalMs: f.pingIntervalMs,
    pingTimeoutMs: f.pingTimeoutMs,
    stableAfterMs: f.stableAfterMs,
    register: async () => {
      const { inventory: inv, problems } = await inventory.collect();
      for (const p of problems) log.warn("inventory problem", { problem: p });
      return buildRegister({
        nodeName: f.node,
        agentVersion: pkg.version,
        agentInstance: instance,
        advertiseAddress: f.advertiseAddress,
        fabric: f.fabric,
        inventory: inv,
        shards: [],
      });
    },
    onCommand: (msg) => log.info("command received", { command: msg.msg.case }),
  });
  log.info("agent starting", { controlPlane: f.controlPlane, instance, pid: process.pid, fabric: f.fabric });
  client.start();
  await new Promise<void>((resolve) => {
    process.on("SIGINT", () => resolve());
    process.on("SIGTERM", () => resolve());
  });
  // Engines are left running: an agent restart must never stop inference.
  await client.stop();
  return 0;
}
