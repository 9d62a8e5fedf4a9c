/**
 * The node registry: which nodes exist, what they have, and whether they are
 * ready, unreachable or lost. Pure and clock-driven (`now` is passed in), so
 * the lifecycle rules are unit-testable without timers or sockets.
 *
 * Only `lost` frees a node's GPUs for re-placement. The gap between
 * unreachable and lost is deliberate: a network blip must not tear down
 * replicas that still serve, and rebuilding a multi-node replica costs many
 * minutes of weight loading.
 */
import type { NodeInventory } from "../common/inventory.ts";

export type { GpuInfo, NodeInventory } from "../common/inventory.ts";

export type NodeState = "ready" | "unreachable" | "lost";

export interface NodeRecord {
  name: string;
  state: NodeState;
  stateSince: number;
  lastSeen: number;
  registeredAt: number;
  agentVersion: string;
  agentInstance: string;
  advertiseAddress: string;
  fabric: Record<string, string>;
  inventory: NodeInventory;
  connected: boolean;
  /**
   * Known from before a control plane restart (it held replicas then) and
   * not registered since: unreachable, its replicas kept for it, until it
   * registers or `lost_after` makes it lost.
   */
  awaiting?: boolean;
}

export interface RegistrationInfo {
  name: string;
  agentVersion: string;
  agentInstance: string;
  advertiseAddress: string;
  fabric: Record<string, string>;
  inventory: NodeInventory;
}

export interface LifecycleTimers {
  unreachableAfterMs: number;
  lostAfterMs: number;
  /** No node may become lost until this long after `startedAt`. */
  startupGraceMs: number;
  /** Above this fraction of non-lost nodes unreachable at once, `lost` is frozen. */
  lostFreezeFraction: number;
}

export interface Transition {
  node: string;
  from: NodeState | "new";
  to: NodeState;
  at: number;
  reason: string;
}

export class Registry {
  private readonly nodes = new Map<string, NodeRecord>();
  private frozen = false;

  constructor(
    private readonly timers: LifecycleTimers,
    readonly startedAt: number,
  ) {}

  get(name: string): NodeRecord | undefined {
    return this.nodes.get(name);
  }

  list(): NodeRecord[] {
    return [...this.nodes.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  get size(): number {
    return this.nodes.size;
  }

  /** True while the mass-unreachable guard holds `lost` back. */
  get lostFrozen(): boolean {
    return this.frozen;
  }

  counts(): Record<NodeState, number> {
    const c: Record<NodeState, number> = { ready: 0, unreachable: 0, lost: 0 };
    for (const n of this.nodes.values()) c[n.state]++;
    return c;
  }

  /** A (re)registering agent: the node is ready with a refreshed inventory. */
  register(info: RegistrationInfo, now: number): Transition | undefined {
    const prev = this.nodes.get(info.name);
    const record: NodeRecord = {
      ...info,
      state: "ready",
      stateSince: prev && prev.state === "ready" ? prev.stateSince : now,
      lastSeen: now,
      registeredAt: now,
      connected: true,
    };
    this.nodes.set(info.name, record);
    if (prev?.state === "ready") return undefined;
    return {
      node: info.name,
      from: prev ? prev.state : "new",
      to: "ready",
      at: now,
      reason: prev?.awaiting
        ? "agent registered after the control plane restart"
        : prev
          ? "agent registered again"
          : "agent registered",
    };
  }

  /**
   * A node the last control plane knew (known-fleet.ts), to be awaited: it
   * counts as silent since `now`, the start, so it is lost `lost_after`
   * later unless its agent registers first.
   */
  expect(info: RegistrationInfo, now: number): void {
    if (this.nodes.has(info.name)) return;
    this.nodes.set(info.name, {
      ...info,
      state: "unreachable",
      stateSince: now,
      lastSeen: now,
      registeredAt: 0,
      connected: false,
      awaiting: true,
    });
  }

  /** Any message from the node's agent proves it alive. */
  seen(name: string, now: number): Transition | undefined {
    const n = this.nodes.get(name);
    if (!n) return undefined;
    n.lastSeen = now;
    if (n.state === "ready") return undefined;
    const from = n.state;
    n.state = "ready";
    n.stateSince = now;
    return { node: name, from, to: "ready", at: now, reason: "agent heard from again" };
  }

  /**
   * A revoked node is lost at once — no grace, no freeze: its agent cannot
   * come back with the certificate it had, so its GPUs are re-placed now.
   */
  revoke(name: string, now: number): Transition | undefined {
    const n = this.nodes.get(name);
    if (!n) return undefined;
    n.connected = false;
    if (n.state === "lost") return undefined;
    return this.move(n, "lost", now, "certificate revoked");
  }

  disconnected(name: string): void {
    const n = this.nodes.get(name);
    if (n) n.connected = false;
  }

  /**
   * Advances every node's lifecycle to `now`. Called on a timer; returns the
   * transitions so the caller can log them and wake the reconciler.
   */
  tick(now: number): Transition[] {
    const out: Transition[] = [];
    for (const n of this.nodes.values()) {
      const silent = now - n.lastSeen;
      if (n.state === "ready" && silent >= this.timers.unreachableAfterMs) {
        out.push(this.move(n, "unreachable", now, `no message for ${Math.round(silent / 1000)}s`));
      }
    }
    const live = [...this.nodes.values()].filter((n) => n.state !== "lost");
    const unreachable = live.filter((n) => n.state === "unreachable").length;
    // The fault is far more likely the control plane's own network than half
    // the fleet failing together; declaring them lost would reshuffle
    // everything for nothing.
    const inGrace = now - this.startedAt < this.timers.startupGraceMs;
    // During the startup grace nothing becomes lost anyway, and a fleet
    // awaited after a restart is all unreachable at first: no freeze to
    // report until the agents had their chance.
    this.frozen = !inGrace && live.length > 0 && unreachable / live.length > this.timers.lostFreezeFraction;
    if (this.frozen || inGrace) return out;
    for (const n of this.nodes.values()) {
      const silent = now - n.lastSeen;
      if (n.state === "unreachable" && silent >= this.timers.lostAfterMs) {
        const why = n.awaiting
          ? `not back ${Math.round(silent / 1000)}s after the control plane started`
          : `no message for ${Math.round(silent / 1000)}s`;
        delete n.awaiting;
        out.push(this.move(n, "lost", now, why));
      }
    }
    return out;
  }

  private move(n: NodeRecord, to: NodeState, now: number, reason: string): Transition {
    const t: Transition = { node: n.name, from: n.state, to, at: now, reason };
    n.state = to;
    n.stateSince = now;
    return t;
  }
}
