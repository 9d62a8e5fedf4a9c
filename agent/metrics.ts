import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { parseListen } from "../common/listen.ts";
import { MetricsRegistry, type Sample } from "../common/prometheus.ts";
import { shardStates } from "../common/shard-state.ts";
import type { StreamClient } from "./stream-client.ts";
import type { Supervisor } from "./supervisor.ts";

/**
 * The agent's own /metrics (`--metrics-listen`, off by default): its
 * engines and its stream to the control plane, as docs/metrics.md lists
 * them. Engine load is not here: the engines export it themselves, and
 * the control plane has every node's on its load board.
 */
export function agentMetrics(
  supervisor: Supervisor,
  stream: () => StreamClient | undefined,
): MetricsRegistry {
  const m = new MetricsRegistry();
  m.gauge("llmgw_agent_engines", "Engines (shards) this agent runs, by state.", () => {
    const shards = supervisor.list();
    return shardStates.map((state) => ({
      labels: { state },
      value: shards.filter((s) => s.state === state).length,
    }));
  });
  m.counter(
    "llmgw_agent_engine_restarts_total",
    "Engines the agent relaunched on its own after a failure and its backoff.",
    () => supervisor.stats.restarts,
  );
  m.counter(
    "llmgw_agent_engine_scrape_errors_total",
    "Scrapes of an engine's /metrics for its load that failed.",
    () => supervisor.stats.scrapeErrors,
  );
  m.counter(
    "llmgw_agent_engines_adopted_total",
    "Engines found running at the agent's start and watched again, not relaunched.",
    () => supervisor.stats.adopted,
  );
  m.gauge(
    "llmgw_agent_orphan_grace",
    "Where the grace for adopted engines no control plane claims stands: 1 for the current state.",
    () =>
      (["not_begun", "running", "over"] as const).map((state) => ({
        labels: { state },
        value: supervisor.stats.orphanGrace === state ? 1 : 0,
      })),
  );
  m.counter(
    "llmgw_agent_orphans_stopped_total",
    "Adopted engines stopped because no control plane claimed them within the grace.",
    () => supervisor.stats.orphansStopped,
  );
  m.gauge("llmgw_agent_stream_connected", "1 while the stream to the control plane is registered.", () =>
    stream()?.state === "connected" ? 1 : 0,
  );
  m.counter(
    "llmgw_agent_stream_reconnects_total",
    "Connection attempts to the control plane after the first.",
    () => stream()?.reconnects ?? 0,
  );
  m.counter(
    "llmgw_agent_stream_messages_total",
    "Messages on the stream to the control plane, by direction (sent, received) and type.",
    () => {
      const s = stream();
      if (!s) return [];
      const out: Sample[] = [];
      for (const [direction, counts] of Object.entries(s.messages))
        for (const [type, n] of counts) out.push({ labels: { direction, type }, value: n });
      return out;
    },
  );
  m.gauge("process_resident_memory_bytes", "Resident set size.", () => process.memoryUsage().rss);
  return m;
}

/** Serves `metrics` at /metrics on `addr`; resolves once listening, with the port. */
export function serveMetrics(
  metrics: MetricsRegistry,
  addr: string,
): Promise<{ server: Server; port: number }> {
  const server = createServer((req, res) => {
    if (req.method === "GET" && req.url === "/metrics") {
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
      res.end(metrics.render());
    } else {
      res.writeHead(404, { "content-type": "text/plain" });
      res.end("not found: the agent serves /metrics only\n");
    }
  });
  const { host, port } = parseListen(addr);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve({ server, port: (server.address() as AddressInfo).port });
    });
  });
}
