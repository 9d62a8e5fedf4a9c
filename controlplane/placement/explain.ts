/**
 * Turning placement counts into what an operator reads. The control
 * plane's ControlService `Explain` (admin/control-service.ts) calls
 * `formatExplanations` for both the human lines and the JSON that
 * `llmgw ctl explain` and the dashboard show; the reconciler's explain
 * (reconcile/explain.ts) uses `requirementText`. Nothing here decides anything.
 */
import type { Requirements } from "./stages.ts";
import type { Assignment, Explanation, Rejection, RejectReason } from "./types.ts";

const plural = (n: number, one: string, many: string): string => (n === 1 ? one : many);

function gib(mib: number): string {
  const g = mib / 1024;
  return Number.isInteger(g) ? `${g}` : g.toFixed(1);
}

function gpuClass(req: Requirements): string {
  const parts: string[] = [];
  if (req.profile.gpuModel) parts.push(req.profile.gpuModel);
  if (req.minMemoryMiB > 0) parts.push(`>=${gib(req.minMemoryMiB)} GiB`);
  return parts.length > 0 ? ` of ${parts.join(" ")}` : "";
}

/** "2 have fewer than 8 free GPUs of >=80 GiB", with the count in front and verbs agreeing. */
export function rejectionMessage(reason: RejectReason, n: number, req: Requirements): string {
  const have = plural(n, "has", "have");
  const gpn = req.gpusPerNode;
  const gpus = plural(gpn, "GPU", "GPUs");
  switch (reason) {
    case "lost":
    case "unreachable":
    case "cordoned":
    case "draining":
      return `${n} ${reason}`;
    case "gpu-model":
      return `${n} ${have} no ${req.profile.gpuModel} GPUs`;
    case "gpu-size":
      return `${n} ${have} fewer than ${gpn} ${gpus}${gpuClass(req)}`;
    case "gpu-memory":
      return `${n} ${have} fewer than ${gpn} ${gpus} with ${Math.round(req.memoryFraction * 100)}% of VRAM free of other processes`;
    case "gpu-free":
      return `${n} ${have} fewer than ${gpn} free ${gpus}${gpuClass(req)}`;
    case "ports": {
      const r = req.portRange;
      return `${n} ${have} fewer than ${req.portsPerNode} free ${plural(req.portsPerNode, "port", "ports")} in ${r.first}-${r.last}`;
    }
    case "fabric-label":
      return `${n} ${plural(n, "lacks", "lack")} fabric label ${req.profile.fabric}`;
    case "fabric-group":
      return `${n} ${plural(n, "is", "are")} in ${req.profile.fabric} groups with fewer than ${req.nodes} eligible nodes of one GPU shape`;
  }
}

export function requirementText(req: Requirements): string {
  const p = req.profile;
  const cls: string[] = [];
  if (p.gpuModel) cls.push(p.gpuModel);
  if (req.minMemoryMiB > 0) cls.push(`>=${gib(req.minMemoryMiB)} GiB`);
  cls.push(`${Math.round(req.memoryFraction * 100)}% VRAM free`);
  const each = `${req.gpusPerNode} ${plural(req.gpusPerNode, "GPU", "GPUs")} (${cls.join(", ")}) and ${req.portsPerNode} ${plural(req.portsPerNode, "port", "ports")}`;
  return req.nodes > 1
    ? `${each} on each of ${req.nodes} nodes sharing one value of fabric label ${p.fabric}`
    : `${each} on one node`;
}

export function rejectionsFrom(
  counts: Map<RejectReason, { count: number; nodes: string[] }>,
  order: readonly RejectReason[],
  req: Requirements,
): Rejection[] {
  const out: Rejection[] = [];
  for (const reason of order) {
    const c = counts.get(reason);
    if (!c || c.count === 0) continue;
    out.push({ reason, count: c.count, nodes: c.nodes, message: rejectionMessage(reason, c.count, req) });
  }
  return out;
}

function ranges(xs: readonly number[]): string {
  const out: string[] = [];
  for (let i = 0; i < xs.length; ) {
    let j = i;
    while (j + 1 < xs.length && xs[j + 1] === xs[j]! + 1) j++;
    out.push(j > i ? `${xs[i]}-${xs[j]}` : `${xs[i]}`);
    i = j + 1;
  }
  return out.join(",");
}

export function assignmentText(a: Assignment): string {
  return a.shards
    .map((s) => {
      const ports = [s.ports.http, ...s.ports.distInit];
      return `rank ${s.rank} on ${s.node} GPU ${ranges(s.gpus)} port ${ranges(ports)}`;
    })
    .join("; ");
}

/** The last failure and the end of the engine's output, which says why far more often than the exit code. */
function failureLines(e: Explanation): string[] {
  if (!e.lastFailure) return [];
  return [`  last failure: ${e.lastFailure.summary}`, ...e.lastFailure.tail.map((l) => `    | ${l}`)];
}

/** Human lines: a headline, then indented detail. */
export function formatExplanation(e: Explanation): string[] {
  const who = e.replicaId ?? e.target;
  const counts = e.rejected.map((r) => r.message).join(", ");
  const tally = `${e.nodesFeasible}/${e.nodesTotal} nodes can host ${e.target}`;
  const lines: string[] = [];
  if (e.placed) {
    lines.push(`${who} placed: ${assignmentText(e.placed)}`);
    lines.push(`  why: ${e.placed.why} (score ${e.placed.score.toFixed(2)})`);
    if (e.note) lines.push(`  status: ${e.note}`);
    lines.push(...failureLines(e));
    if (e.nodesTotal > 0) lines.push(`  ${tally}${counts ? `: ${counts}` : ""}`);
  } else {
    const prefix = e.replicaId ? `${e.replicaId}: ` : "";
    if (e.note) lines.push(`${prefix}${e.note}`);
    lines.push(...failureLines(e));
    lines.push(`${e.note ? "  " : prefix}${tally}${counts ? `: ${counts}` : ""}`);
    lines.push(`  needs: ${e.requirement}`);
    if (e.bestPartial) lines.push(`  closest: ${e.bestPartial.detail}`);
    for (const r of e.rejected) {
      if (r.nodes.length === 0) continue;
      const more = r.count > r.nodes.length ? `, … (${r.count - r.nodes.length} more)` : "";
      lines.push(`  ${r.reason}: ${r.nodes.join(", ")}${more}`);
    }
  }
  return lines;
}

/** A JSON-safe copy (no Sets, no undefined) for `--json` and the admin API. */
export function explanationJSON(e: Explanation): Record<string, unknown> {
  return JSON.parse(JSON.stringify(e)) as Record<string, unknown>;
}

export function formatExplanations(list: readonly Explanation[]): { lines: string[]; json: string } {
  return {
    lines: list.flatMap(formatExplanation),
    json: JSON.stringify(list.map(explanationJSON), null, 2),
  };
}
