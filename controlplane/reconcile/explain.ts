/**
 * `llmgw ctl explain MODEL`: for every replica of the model, where it runs
 * and why there, or why it cannot run — computed by a dry-run reconcile pass
 * with full explanations, so the answer is exactly what the next real pass
 * would decide. Format with placement/explain.ts `formatExplanations`.
 */
import { formatDuration } from "../../common/duration.ts";
import type { CatalogProfile } from "../catalog.ts";
import { requirementText } from "../placement/explain.ts";
import { requirements } from "../placement/stages.ts";
import type { Explanation } from "../placement/types.ts";
import { plan } from "./plan.ts";
import { outdatedWhy } from "./rollout.ts";
import { replicaStatus } from "./table.ts";
import type { Failure, PlanState, ReplicaRecord } from "./types.ts";

/** Lines of an engine's output shown with its failure: enough for a traceback's last frames and its error. */
const TAIL_LINES = 12;

function failureOf(f: Failure | undefined, now: number): Pick<Explanation, "lastFailure"> {
  if (!f) return {};
  const age = formatDuration(Math.max(0, Math.round((now - f.at) / 1000)) * 1000);
  return {
    lastFailure: { summary: `${f.reason}, ${age} ago`, tail: (f.outputTail ?? []).slice(-TAIL_LINES) },
  };
}

function outdatedNote(r: ReplicaRecord, p: CatalogProfile, retiredKeys: PlanState["retiredKeys"]): string {
  const why = outdatedWhy(r, p, retiredKeys);
  if (!why) return "";
  return `; runs an older spec (${why}): ${p.rollout.paused ? "the rollout is paused (rollout.paused)" : "the rollout replaces it"}`;
}

/** Explanations for a model (by name or alias), or undefined when the catalog has no such model. */
export function explainModel(state: PlanState, model: string, now: number): Explanation[] | undefined {
  const m = state.catalog.get(model);
  if (!m) return undefined;
  if (m.routerOnly) {
    return [
      {
        target: m.name,
        requirement: "nothing: router-only model",
        nodesTotal: 0,
        nodesFeasible: 0,
        rejected: [],
        note:
          m.endpoints.length > 0
            ? `router-only: served by static endpoints ${m.endpoints.map((e) => e.id).join(", ")}`
            : "router-only: no profiles and no static endpoints yet",
      },
    ];
  }
  const actions = plan(state, now, { explainAll: true });
  const out: Explanation[] = [];
  for (const p of m.profiles) {
    const req = requirements(p, state.settings.portRange);
    const records = state.replicas
      .filter((r) => r.model === m.name && r.profile === p.name && !r.retire && r.shards.length > 0)
      .sort((a, b) => a.index - b.index);
    for (const r of records) {
      out.push({
        target: p.key,
        replicaId: r.id,
        requirement: requirementText(req),
        nodesTotal: 0,
        nodesFeasible: 0,
        rejected: [],
        placed: {
          shards: r.shards.map((s) => ({ rank: s.rank, node: s.node, gpus: s.gpus, ports: s.ports })),
          score: r.placement?.score ?? 0,
          why:
            r.placement?.why ?? (r.origin === "reported" ? "adopted from a running agent" : "placed earlier"),
          ...(r.placement?.fabric ? { fabric: r.placement.fabric } : {}),
        },
        note: `${replicaStatus(r, now, state.backoff.get(r.model))}, generation ${r.generation}, ${r.restarts} restart(s)${outdatedNote(r, p, state.retiredKeys)}`,
        ...failureOf(r.lastFailure, now),
      });
    }
    for (const a of actions) {
      if (a.kind === "wait" && a.model === m.name && a.profile === p.name && a.explanation) {
        out.push({ ...a.explanation, ...failureOf(state.backoff.get(m.name)?.lastFailure, now) });
      } else if (a.kind === "place" && a.model === m.name && a.profile === p.name) {
        out.push({
          target: p.key,
          replicaId: a.replicaId,
          requirement: requirementText(req),
          nodesTotal: 0,
          nodesFeasible: 0,
          rejected: [],
          placed: a.assignment,
          note: "not running yet: the next reconcile pass places it here",
        });
      }
    }
  }
  return out;
}
