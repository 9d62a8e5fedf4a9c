import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type ServiceImpl } from "@connectrpc/connect";
import { parseDuration } from "../../common/duration.ts";
import type { EdgeSyncClient } from "../../common/edgesync-client.ts";
import { ControlService, NodeSchema, NodeState } from "../../proto/gen/control/v1/control_pb.ts";
import type { ClaimRefusals } from "../agentsvc/claim-refusals.ts";
import type { CatalogProfile } from "../catalog.ts";
import type { EdgeStatusPoller } from "../edge-status.ts";
import type { EngineKeys } from "../engine-keys.ts";
import type { IntentStore } from "../intent-store.ts";
import type { LoadBoard, ShardAt } from "../load-board.ts";
import { formatExplanations } from "../placement/explain.ts";
import { rolloutLine } from "../reconcile/rollout.ts";
import type { Reconciler } from "../reconciler.ts";
import type { Registry } from "../registry.ts";
import type { Scaler } from "../scaler.ts";
import { scalingLines } from "../scaling/explain.ts";
import { nodeToProto } from "./nodes.ts";
import { modelSummaries, replicaToProto } from "./replicas.ts";

/** What the operator API reads; the server wires the live objects in. */
export interface ControlServiceDeps {
  registry: Registry;
  intents: IntentStore;
  reconciler: Reconciler;
  loads: LoadBoard;
  /** Scaling's last decision per model, for explain and the model summaries. */
  scaler?: Pick<Scaler, "view">;
  now?: () => number;
  /** Present when the control plane has an edge to poll (edge.url and its secret). */
  edgeStatus?: Pick<EdgeStatusPoller, "view">;
  /** Present when agent_tls is enabled (agentsvc/enroll.ts). */
  joinTokens?: {
    createToken(
      ttlMs: number,
      uses: number,
      binding?: { node: string; replace: boolean },
    ): { token: string; expiresAt: number; uses: number; caFingerprint: string };
  };
  /** Present when agent_tls is enabled: the last refused claim on each node name. */
  claims?: Pick<ClaimRefusals, "latest">;
  /** Present when agent_tls is enabled: node revocation (server.ts). */
  revocation?: {
    /** Throws NotFound for a node neither the registry nor the certificate record knows. */
    revoke(node: string): { serials: string[]; disconnected: boolean };
    /** Nodes revoked and not enrolled again, with when. */
    revokedNodes(): Map<string, number>;
  };
  /** The edge link's EdgeSync client (server.ts), when `edge` is configured. */
  edgeSync?: EdgeSyncClient;
  /** The engine key secret (engine-keys.ts), for its rotation. */
  engineKeys?: Pick<EngineKeys, "rotate">;
}

/** Operators get a drain deadline unless they name one. */
export const DEFAULT_DRAIN_DEADLINE_MS = parseDuration("10m");

type Calls<K extends keyof ServiceImpl<typeof ControlService>> = Pick<ServiceImpl<typeof ControlService>, K>;

export function controlRoutes(deps: ControlServiceDeps) {
  const now = deps.now ?? Date.now;
  const known = (name: string) => {
    if (!deps.registry.get(name)) {
      throw new ConnectError(`node "${name}" is not known to this control plane`, Code.NotFound);
    }
  };
  const calls: ServiceImpl<typeof ControlService> = {
    ...fleetCalls(deps, now, known),
    ...intentCalls(deps, now, known),
    ...enrollmentCalls(deps),
    ...edgeCalls(deps),
    ...engineKeyCalls(deps, now),
  };
  return (router: ConnectRouter) => {
    router.service(ControlService, calls);
  };
}

/** What the fleet is: nodes, replicas, models, and why a model's replicas are placed as they are. */
function fleetCalls(
  deps: ControlServiceDeps,
  now: () => number,
  known: (name: string) => void,
): Calls<"listNodes" | "getNode" | "listReplicas" | "listModels" | "explain"> {
  const { registry, intents, reconciler, loads } = deps;
  const live = (at: ShardAt) => ({
    pid: reconciler.pidOf(at.replicaId, at.rank, at.node),
    load: loads.get(at),
  });
  // A revoked node stays listed (as revoked) even after a restart emptied
  // the registry of it, until it enrolls again.
  const nodes = () => {
    const revoked = deps.revocation?.revokedNodes() ?? new Map<string, number>();
    const listed = registry
      .list()
      .map((n) => nodeToProto(n, intents.get(n.name), revoked.get(n.name), deps.claims?.latest(n.name)));
    for (const [name, at] of revoked) {
      if (registry.get(name)) continue;
      listed.push(create(NodeSchema, { name, state: NodeState.LOST, revokedAtUnixMs: BigInt(at) }));
    }
    return listed.sort((a, b) => a.name.localeCompare(b.name));
  };
  return {
    listNodes: () => ({ nodes: nodes() }),
    getNode: (req) => {
      const node = nodes().find((n) => n.name === req.name);
      if (!node) known(req.name);
      return { node };
    },
    listReplicas: () => {
      const t = now();
      const outdated = new Map(reconciler.outdated().map((o) => [o.replica.id, o.why]));
      return {
        replicas: reconciler.table
          .list()
          .map((r) => replicaToProto(r, t, reconciler.table.backoff.get(r.model), live, outdated.get(r.id))),
      };
    },
    listModels: () => ({
      models: modelSummaries(reconciler.currentCatalog, reconciler.table.list(), now(), deps.scaler),
    }),
    explain: (req) => {
      const list = reconciler.explain(req.model);
      if (!list) throw new ConnectError(`model "${req.model}" is not in the catalog`, Code.NotFound);
      const out = formatExplanations(list);
      const m = reconciler.currentCatalog.get(req.model);
      // A model with a fixed count (max == min) reads as it always has.
      const scaling = m && deps.scaler?.view(m.name);
      if (m && scaling && scaling.max > scaling.min)
        out.lines = [...scalingLines(scaling, m.scaling, now()), ...out.lines];
      if (m) out.lines = [...rolloutLines(m.profiles, reconciler), ...out.lines];
      return out;
    },
  };
}

/** A line per profile of the model with replicas a rollout still replaces. */
function rolloutLines(profiles: readonly CatalogProfile[], reconciler: Reconciler): string[] {
  const outdated = reconciler.outdated();
  return profiles.flatMap((p) => {
    const whys = outdated
      .filter((o) => o.replica.model === p.model && o.replica.profile === p.name)
      .map((o) => o.why);
    return rolloutLine(p, whys) ?? [];
  });
}

/**
 * Cordon and drain survive a restart (SQLite) and take effect on the next
 * pass, which they trigger.
 */
function intentCalls(
  deps: ControlServiceDeps,
  now: () => number,
  known: (name: string) => void,
): Calls<"cordon" | "uncordon" | "drain"> {
  const { intents, reconciler } = deps;
  return {
    cordon: (req) => {
      known(req.node);
      intents.cordon(req.node, now());
      reconciler.trigger(`${req.node} cordoned`);
      return {};
    },
    uncordon: (req) => {
      known(req.node);
      intents.uncordon(req.node, now());
      reconciler.trigger(`${req.node} uncordoned`);
      return {};
    },
    drain: (req) => {
      known(req.node);
      intents.drain(req.node, now() + (req.deadlineMs || DEFAULT_DRAIN_DEADLINE_MS), now());
      reconciler.trigger(`${req.node} draining`);
      return {};
    },
  };
}

/** Join tokens and revocation: there only when agent mTLS is enabled. */
function enrollmentCalls(deps: ControlServiceDeps): Calls<"createJoinToken" | "revokeNode"> {
  return {
    createJoinToken: (req) => {
      if (!deps.joinTokens) {
        throw new ConnectError(
          "agent mTLS is not enabled on this control plane: set agent_tls.enabled: true",
          Code.FailedPrecondition,
        );
      }
      const ttl = Number(req.ttlMs);
      if (!Number.isSafeInteger(ttl)) throw new ConnectError("ttl_ms is out of range", Code.InvalidArgument);
      if (req.replace && !req.node)
        throw new ConnectError(
          "replace needs node: the node whose certificates the token replaces",
          Code.InvalidArgument,
        );
      const t = deps.joinTokens.createToken(
        ttl,
        req.uses,
        req.node ? { node: req.node, replace: req.replace } : undefined,
      );
      return {
        token: t.token,
        expiresAtUnixMs: BigInt(t.expiresAt),
        uses: t.uses,
        caFingerprint: t.caFingerprint,
      };
    },
    revokeNode: (req) => {
      if (!deps.revocation) {
        throw new ConnectError(
          "agent mTLS is not enabled on this control plane, so there is no certificate to revoke: set agent_tls.enabled: true",
          Code.FailedPrecondition,
        );
      }
      return deps.revocation.revoke(req.node);
    },
  };
}

/** The engine key secret's rotation; the rollout does the rest. */
function engineKeyCalls(deps: ControlServiceDeps, now: () => number): Calls<"rotateEngineKeys"> {
  return {
    rotateEngineKeys: () => {
      if (!deps.engineKeys) {
        throw new ConnectError("this control plane launches engines without keys", Code.FailedPrecondition);
      }
      deps.engineKeys.rotate(now());
      deps.reconciler.trigger("engine key secret rotated");
      return { replicas: deps.reconciler.retiredKeyReplicas() };
    },
  };
}

/** What the edge says: its pools' status (polled) and key usage (asked at once). */
function edgeCalls(deps: ControlServiceDeps): Calls<"getEdgeStatus" | "getKeyUsage"> {
  return {
    getEdgeStatus: (req) => {
      if (!deps.edgeStatus) return { configured: false };
      const view = deps.edgeStatus.view(req.model);
      if (req.model !== "" && view.lastSuccessAtUnixMs > 0n && view.models.length === 0)
        throw new ConnectError(`the edge reported no pool for model "${req.model}"`, Code.NotFound);
      return view;
    },
    getKeyUsage: async () => {
      const edge = deps.edgeSync;
      if (!edge) {
        throw new ConnectError(
          "this control plane has no edge link (edge.url and the EdgeSync secret), and key usage is kept at the edge",
          Code.FailedPrecondition,
        );
      }
      try {
        return { usage: (await edge.getUsage({})).usage };
      } catch (err) {
        const e = ConnectError.from(err);
        throw new ConnectError(`the edge did not answer GetUsage: ${e.rawMessage}`, Code.Unavailable);
      }
    },
  };
}
