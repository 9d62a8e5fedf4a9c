/**
 * The scaling part of `llmgw ctl explain MODEL`: why the model has the
 * replicas it has — the signal and its sources, the target, and the last
 * decision with its time. Nothing here decides anything.
 */
import type { ScalingSettings } from "../catalog.ts";
import type { ModelScale } from "../reconcile/scale.ts";

const ago = (ms: number) => (ms < 120_000 ? `${Math.round(ms / 1000)}s` : `${Math.round(ms / 60_000)}m`);

export function scalingLines(m: ModelScale, s: ScalingSettings, now: number): string[] {
  const lines = [
    `scaling: ${m.desired} replica(s) wanted, ${m.ready} ready (min ${m.min}, max ${m.max}; target saturation ${s.targetSaturation.toFixed(2)} ± ${s.tolerance.toFixed(2)})`,
    `  why: ${m.why}`,
  ];
  if (m.signal) {
    const perMin = m.signal.trendPerMs * 60_000;
    lines.push(
      `  signal: demand ${m.signal.demand.toFixed(2)} replica(s) at saturation 1, mean of ${m.signal.samples} sample(s) over ${Math.round(m.signal.coveredMs / 1000)}s of a ${Math.round(s.windowMs / 1000)}s window, trend ${perMin >= 0 ? "+" : ""}${perMin.toFixed(2)}/min; load time ${m.loadMs > 0 ? `${Math.round(m.loadMs / 1000)}s` : "not seen yet"}`,
    );
  }
  for (const source of m.sources) lines.push(`  ${source}`);
  lines.push(
    m.last
      ? `  last decision: ${m.last.to > m.last.from ? "up" : "down"} ${m.last.from} → ${m.last.to} at ${new Date(m.last.at).toISOString()} (${ago(now - m.last.at)} ago): ${m.last.why}`
      : "  last decision: none since the control plane started",
  );
  return lines;
}
