// ctl draws its tables with common/text-table.ts, the renderer `llmgw bench` uses too.
export { renderTable } from "../../common/text-table.ts";

export function ago(ms: number, now = Date.now()): string {
  if (!(ms > 0)) return "-";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}
