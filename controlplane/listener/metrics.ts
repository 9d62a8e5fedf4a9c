import type { MetricsRegistry } from "../../common/prometheus.ts";
import type { ListenerGuard } from "./guard.ts";

/** The listeners' bounds on /metrics (docs/metrics.md): how full each is, and what its caps and timers refused. */
export function registerListenerMetrics(metrics: MetricsRegistry, guards: readonly ListenerGuard[]): void {
  metrics.gauge("llmgw_listener_connections", "Open connections, by listener.", () =>
    guards.map((g) => ({ labels: { listener: g.name }, value: g.budget.connections })),
  );
  metrics.counter(
    "llmgw_listener_connections_refused_total",
    "Connections refused at a listener's cap, by listener and cap (total, per_address).",
    () =>
      guards.flatMap((g) =>
        Object.entries(g.budget.refused).map(([cap, value]) => ({
          labels: { listener: g.name, cap },
          value,
        })),
      ),
  );
  metrics.counter(
    "llmgw_listener_idle_closed_total",
    "Connections closed for doing nothing, by listener and reason (unauthenticated, idle).",
    () =>
      guards.flatMap((g) =>
        Object.entries(g.closed).map(([reason, value]) => ({ labels: { listener: g.name, reason }, value })),
      ),
  );
}
