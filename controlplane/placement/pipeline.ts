/**
 * Placement of one replica: filter → (group) → score → pick, in the manner
 * of Nomad's scheduler. Every ready node is run through the per-node stages
 * of stages.ts; a node failing a stage is counted under that stage's reason.
 * Multi-node replicas then need `nodes` survivors that share one value of
 * the profile's fabric label and the same GPU shape. Every rank is placed or
 * none is: the answer is one complete assignment or an explanation.
 */
import { rejectionsFrom, requirementText } from "./explain.ts";
import type { Fleet, NodeView } from "./fleet.ts";
import { lowestFree, lowestFreeBlock } from "./ports.ts";
import {
  GPU_STAGES,
  type GpuTally,
  gpuShape,
  nodeStateStage,
  portStage,
  type Requirements,
  requirements,
  schedulableStage,
  scoreNode,
  tallyGpus,
} from "./stages.ts";
import {
  type Assignment,
  type Explanation,
  type PlacementProfile,
  type PlacementResult,
  type PortAssignment,
  REJECT_REASONS,
  type RejectReason,
  type ShardAssignment,
} from "./types.ts";

export interface PlaceOptions {
  replicaId?: string;
  /**
   * Count every rejection (default). Off, nodes that obviously lack free GPUs
   * are skipped without being classified — the reconciler's fast path; it
   * re-runs with explain on when a replica turns out unplaceable.
   */
  explain?: boolean;
}

interface Candidate {
  view: NodeView;
  gpus: number[];
  score: number;
}

const SAMPLE_NODES = 5;
const GPU_STAGE_RANK: Partial<Record<RejectReason, number>> = {
  "gpu-model": 0,
  "gpu-size": 1,
  "gpu-memory": 2,
  "gpu-free": 3,
  ports: 4,
};

class Tally {
  readonly counts = new Map<RejectReason, { count: number; nodes: string[] }>();
  constructor(readonly enabled: boolean) {}
  reject(view: NodeView, reason: RejectReason): void {
    if (!this.enabled) return;
    let c = this.counts.get(reason);
    if (!c) {
      c = { count: 0, nodes: [] };
      this.counts.set(reason, c);
    }
    c.count++;
    if (c.nodes.length < SAMPLE_NODES) c.nodes.push(view.name);
  }
}

/** The node that came closest, for "closest: …" in the explanation. */
class ClosestFit {
  private best: { view: NodeView; stage: number; have: number; reason: RejectReason } | undefined;
  offer(view: NodeView, reason: RejectReason, t: GpuTally | undefined): void {
    const stage = GPU_STAGE_RANK[reason];
    if (stage === undefined || !t) return;
    const have = [t.matchingModel, t.bigEnough, t.memoryOk, t.free.length, t.free.length][stage]!;
    const b = this.best;
    if (!b || stage > b.stage || (stage === b.stage && have > b.have))
      this.best = { view, stage, have, reason };
  }
  describe(req: Requirements): { nodes: string[]; detail: string } | undefined {
    const b = this.best;
    if (!b) return undefined;
    const gpn = req.gpusPerNode;
    const name = b.view.name;
    const detail = {
      "gpu-model": `${name} has no matching GPUs`,
      "gpu-size": `${name} has ${b.have} of ${gpn} GPUs big enough`,
      "gpu-memory": `${name} has ${b.have} of ${gpn} GPUs with enough VRAM free of other processes`,
      "gpu-free": `${name} has ${b.have} of ${gpn} GPUs free`,
      ports: `${name} has the GPUs but only ${req.portRange.last - req.portRange.first + 1 - b.view.usedInRange} free ports (needs ${req.portsPerNode})`,
    }[b.reason as "gpu-model"];
    return { nodes: [name], detail };
  }
}

/** Runs one node through every per-node stage; a candidate, or the reason it was rejected. */
function evaluate(
  view: NodeView,
  req: Requirements,
  explain: boolean,
  tally: Tally,
  partial: ClosestFit,
): Candidate | undefined {
  const early = nodeStateStage(view) ?? schedulableStage(view);
  if (early) {
    tally.reject(view, early);
    return undefined;
  }
  if (!explain && view.unallocatedCount < req.gpusPerNode) return undefined;
  const t = tallyGpus(view, req);
  let reason: RejectReason | undefined;
  for (const stage of GPU_STAGES) {
    reason = stage(view, req, t);
    if (reason) break;
  }
  reason ??= portStage(view, req);
  if (reason) {
    tally.reject(view, reason);
    if (explain) partial.offer(view, reason, t);
    return undefined;
  }
  return { view, gpus: t.free.slice(0, req.gpusPerNode), score: scoreNode(view, req) };
}

export function placeReplica(
  fleet: Fleet,
  profile: PlacementProfile,
  opts: PlaceOptions = {},
): PlacementResult {
  const req = requirements(profile, fleet.portRange);
  const explain = opts.explain ?? true;
  const tally = new Tally(explain);
  const partial = new ClosestFit();
  const candidates: Candidate[] = [];
  for (const view of fleet.views) {
    const c = evaluate(view, req, explain, tally, partial);
    if (c) candidates.push(c);
  }
  return decide({ candidates, req, tally, partial }, baseExplanation(req, fleet, opts.replicaId));
}

function baseExplanation(req: Requirements, fleet: Fleet, replicaId: string | undefined): Explanation {
  return {
    target: req.profile.key,
    ...(replicaId !== undefined ? { replicaId } : {}),
    requirement: requirementText(req),
    nodesTotal: fleet.views.length,
    nodesFeasible: 0,
    rejected: [],
  };
}

/** What evaluating the fleet for one profile found: the nodes that fit, the rejections and the nearest miss. */
interface Evaluated {
  candidates: Candidate[];
  req: Requirements;
  tally: Tally;
  partial: ClosestFit;
}

function decide(e: Evaluated, explanation: Explanation): PlacementResult {
  if (e.req.nodes > 1) return placeGang(e, explanation);
  const { candidates, req, tally, partial } = e;
  const best = pickBest(candidates);
  explanation.nodesFeasible = candidates.length;
  explanation.rejected = rejectionsFrom(tally.counts, REJECT_REASONS, req);
  if (!best) {
    const bp = partial.describe(req);
    if (bp) explanation.bestPartial = bp;
    return { ok: false, explanation };
  }
  const ports = portsFor([best.view], req, req.ports.rank0Block);
  if (!ports) return { ok: false, explanation };
  const assignment: Assignment = {
    shards: [{ rank: 0, node: best.view.name, gpus: best.gpus, ports: ports[0]! }],
    score: best.score,
    why: whySingle(best, req),
  };
  explanation.placed = assignment;
  return { ok: true, assignment, explanation };
}

/**
 * Repeated placement of one profile, for the reconciler: every node is
 * evaluated once, and after each placement only the nodes it used are
 * evaluated again — the others' stage results and scores cannot have
 * changed. It reserves what it places in the fleet. The picks are the same
 * as calling placeReplica and Fleet.reserve in a loop (ties break by node
 * name, never by order). It counts nothing: when a placement fails, ask
 * placeReplica with explain on for the reasons.
 */
export class PlacementSession {
  private readonly req: Requirements;
  private readonly candidates = new Map<string, Candidate>();
  private readonly tally = new Tally(false);
  private readonly partial = new ClosestFit();

  constructor(
    private readonly fleet: Fleet,
    private readonly profile: PlacementProfile,
  ) {
    this.req = requirements(profile, fleet.portRange);
    for (const view of fleet.views) this.refresh(view);
  }

  private refresh(view: NodeView): void {
    const c = evaluate(view, this.req, false, this.tally, this.partial);
    if (c) this.candidates.set(view.name, c);
    else this.candidates.delete(view.name);
  }

  /** Places and reserves one replica, or returns undefined when it does not fit. */
  place(replicaId?: string): Assignment | undefined {
    const found = {
      candidates: [...this.candidates.values()],
      req: this.req,
      tally: this.tally,
      partial: this.partial,
    };
    const r = decide(found, baseExplanation(this.req, this.fleet, replicaId));
    if (!r.ok) return undefined;
    this.fleet.reserve(this.profile.key, r.assignment);
    for (const s of r.assignment.shards) {
      const v = this.fleet.get(s.node);
      if (v) this.refresh(v);
    }
    return r.assignment;
  }
}

function pickBest(cs: readonly Candidate[]): Candidate | undefined {
  let best: Candidate | undefined;
  for (const c of cs) {
    if (!best || c.score > best.score || (c.score === best.score && c.view.name < best.view.name)) best = c;
  }
  return best;
}

function byScore(a: Candidate, b: Candidate): number {
  return b.score - a.score || (a.view.name < b.view.name ? -1 : a.view.name > b.view.name ? 1 : 0);
}

function strategyWord(req: Requirements): string {
  return req.profile.strategy === "spread" ? "spread" : "bin-pack";
}

function whySingle(c: Candidate, req: Requirements): string {
  const total = c.view.node.gpus.length;
  const left = c.view.unallocatedCount - req.gpusPerNode;
  const same = c.view.shardsOf(req.profile.key);
  const anti = same > 0 ? `; ${same} replica(s) of ${req.profile.key} already there` : "";
  return `${strategyWord(req)}: leaves ${left} of ${total} GPUs free on ${c.view.name}${anti}`;
}

/**
 * Ports for each rank. Rank 0 may need a block (vLLM master port, SGLang
 * dist-init); with `commonBase` the block sits at the same numbers on every
 * rank. The block is chosen before the HTTP port so that a fragmented range
 * still yields a contiguous block when one exists.
 */
function portsFor(
  views: readonly NodeView[],
  req: Requirements,
  rank0Block: number,
): PortAssignment[] | undefined {
  const range = req.portRange;
  const n = req.ports;
  let common: number | undefined;
  if (n.commonBase && n.rank0Block > 0) {
    common = lowestFreeBlock(
      views.map((v) => v.ports),
      n.rank0Block,
      range,
    );
    if (common === undefined) return undefined;
  }
  const out: PortAssignment[] = [];
  for (let rank = 0; rank < views.length; rank++) {
    const v = views[rank]!;
    const size = rank === 0 ? rank0Block : n.otherBlock;
    let distInit: number[] = [];
    if (size > 0) {
      const start = common ?? lowestFreeBlock([v.ports], size, range);
      if (start === undefined) return undefined;
      distInit = Array.from({ length: size }, (_, i) => start + i);
    }
    const taken = new Set(distInit);
    let http: number | undefined = range.first;
    for (;;) {
      http = lowestFree(v.ports, range, http);
      if (http === undefined) return undefined;
      if (!taken.has(http)) break;
      http++;
    }
    out.push({ http, distInit });
  }
  return out;
}

function placeGang(
  { candidates, req, tally, partial }: Evaluated,
  explanation: Explanation,
): PlacementResult {
  const key = req.profile.fabric!;
  const groups = new Map<string, { value: string; shape: string; members: Candidate[] }>();
  for (const c of candidates) {
    const value = c.view.node.fabric[key];
    if (value === undefined || value === "") {
      tally.reject(c.view, "fabric-label");
      continue;
    }
    const shape = gpuShape(c.view, c.gpus);
    const gk = `${value}\u0000${shape}`;
    let g = groups.get(gk);
    if (!g) {
      g = { value, shape, members: [] };
      groups.set(gk, g);
    }
    g.members.push(c);
  }

  let best:
    | { value: string; picked: Candidate[]; score: number; ports: PortAssignment[]; eligible: number }
    | undefined;
  let feasible = 0;
  let largest: { value: string; shape: string; members: Candidate[] } | undefined;
  for (const g of groups.values()) {
    if (!largest || g.members.length > largest.members.length) largest = g;
    if (g.members.length < req.nodes) {
      for (const c of g.members) tally.reject(c.view, "fabric-group");
      continue;
    }
    g.members.sort(byScore);
    const picked = g.members.slice(0, req.nodes);
    const ports = portsFor(
      picked.map((c) => c.view),
      req,
      req.ports.rank0Block,
    );
    if (!ports) {
      for (const c of g.members) tally.reject(c.view, "ports");
      continue;
    }
    feasible += g.members.length;
    const score = picked.reduce((s, c) => s + c.score, 0) / picked.length;
    if (!best || score > best.score || (score === best.score && g.value < best.value)) {
      best = { value: g.value, picked, score, ports, eligible: g.members.length };
    }
  }

  explanation.nodesFeasible = feasible;
  explanation.rejected = rejectionsFrom(tally.counts, REJECT_REASONS, req);
  if (!best) {
    if (largest) {
      explanation.bestPartial = {
        nodes: largest.members.map((c) => c.view.name),
        detail: `fabric ${key}=${largest.value} has ${largest.members.length} of ${req.nodes} eligible nodes with ${largest.shape} (${largest.members
          .slice(0, SAMPLE_NODES)
          .map((c) => c.view.name)
          .join(", ")})`,
      };
    } else {
      const bp = partial.describe(req);
      if (bp) explanation.bestPartial = bp;
    }
    return { ok: false, explanation };
  }
  const shards: ShardAssignment[] = best.picked.map((c, rank) => ({
    rank,
    node: c.view.name,
    gpus: c.gpus,
    ports: best.ports[rank]!,
  }));
  const left = best.picked.map((c) => c.view.unallocatedCount - req.gpusPerNode);
  const assignment: Assignment = {
    shards,
    score: best.score,
    fabric: { key, value: best.value },
    why: `${strategyWord(req)} within fabric ${key}=${best.value} (${best.eligible} eligible nodes): leaves ${left.join("/")} GPUs free`,
  };
  explanation.placed = assignment;
  return { ok: true, assignment, explanation };
}
