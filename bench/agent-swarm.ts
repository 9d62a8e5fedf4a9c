/**
 * Many agents in one process, for bench:agents. Each one is a real
 * StreamClient with its own HTTP/2 connection, exactly as a GPU node's agent
 * would be; only the inventory is simulated. Prints one JSON line per
 * registration so the parent can time them.
 */
import { randomUUID } from "node:crypto";
import { simulatedGpus } from "../agent/inventory.ts";
import { StreamClient } from "../agent/stream-client.ts";
import { buildRegister } from "../agent/wire.ts";
import { createLogger } from "../common/log.ts";

const [url, countText, prefix] = process.argv.slice(2);
const count = Number(countText);
const quiet = createLogger({}, "error");
const clients: StreamClient[] = [];

for (let i = 0; i < count; i++) {
  const name = `${prefix}-${String(i).padStart(4, "0")}`;
  const instance = randomUUID();
  const gpus = simulatedGpus(name, [{ count: 8, model: "H100", memoryGiB: 80 }]);
  const client = new StreamClient({
    url: url!,
    log: quiet,
    stableAfterMs: 1_000,
    register: async () =>
      buildRegister({
        nodeName: name,
        agentVersion: "bench",
        agentInstance: instance,
        advertiseAddress: "127.0.0.1",
        fabric: { ib: `island-${i % 4}` },
        shards: [],
        inventory: { gpus, cpuCores: 64, ramTotalMiB: 2_000_000, hostname: name, simulated: true },
      }),
    onCommand: () => {},
    onConnected: () =>
      process.stdout.write(
        `${JSON.stringify({ node: name, at: Date.now(), session: client.sessions, due: client.dialDueAt, dialed: client.dialedAt })}\n`,
      ),
  });
  clients.push(client);
}
for (const c of clients) c.start();
process.on("SIGTERM", async () => {
  await Promise.all(clients.map((c) => c.stop()));
  process.exit(0);
});
