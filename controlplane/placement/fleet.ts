/**
 * The working view of the fleet during one placement or reconcile pass: the
 * snapshot plus everything reserved so far in the pass, so the second
 * replica placed in a pass sees the GPUs and ports the first one took.
 *
 * Mutable by design but free of I/O; a pass builds one, reserves into it
 * and throws it away. The snapshot itself is never modified.
 */
import type { PortSet } from "./ports.ts";
import type { Assignment, PlacementNode, PortRange } from "./types.ts";

/**
 * One node as a pass sees it. The snapshot's sets are read as they are and
 * only what the pass adds is kept beside them (copy-on-write), because a
 * reconcile pass builds a thousand of these every few seconds and almost
 * never touches most of them.
 */
export class NodeView implements PortSet {
  private extraGpus: Set<number> | undefined;
  private extraPorts: Set<number> | undefined;
  /** Ports held inside the range, kept so the port stage is O(1). */
  usedInRange: number;
  private allocatedCount: number;
  private byProfile: Map<string, number> | undefined;

  constructor(
    readonly node: PlacementNode,
    private readonly range: PortRange,
  ) {
    let n = 0;
    for (const p of node.usedPorts) if (p >= range.first && p <= range.last) n++;
    this.usedInRange = n;
    this.allocatedCount = node.allocatedGpus.size;
  }

  get name(): string {
    return this.node.name;
  }

  get unallocatedCount(): number {
    return this.node.gpus.length - this.allocatedCount;
  }

  isAllocated(gpu: number): boolean {
    return this.node.allocatedGpus.has(gpu) || (this.extraGpus?.has(gpu) ?? false);
  }

  portUsed(port: number): boolean {
    return this.node.usedPorts.has(port) || (this.extraPorts?.has(port) ?? false);
  }

  /** Every held port (snapshot and pass), for the port allocator. */
  get ports(): PortSet {
    return this;
  }

  has(port: number): boolean {
    return this.portUsed(port);
  }

  holdGpus(gpus: Iterable<number>): void {
    for (const g of gpus) {
      if (this.isAllocated(g)) continue;
      this.extraGpus ??= new Set();
      this.extraGpus.add(g);
      this.allocatedCount++;
    }
  }

  holdPorts(ports: Iterable<number>): void {
    for (const p of ports) {
      if (this.portUsed(p)) continue;
      this.extraPorts ??= new Set();
      this.extraPorts.add(p);
      if (p >= this.range.first && p <= this.range.last) this.usedInRange++;
    }
  }

  /** Shards of a profile on this node, for replica anti-affinity. */
  shardsOf(profileKey: string): number {
    return this.byProfile?.get(profileKey) ?? 0;
  }

  countShard(profileKey: string, delta = 1): void {
    this.byProfile ??= new Map();
    this.byProfile.set(profileKey, (this.byProfile.get(profileKey) ?? 0) + delta);
  }
}

export class Fleet {
  readonly views: NodeView[];
  private readonly byName = new Map<string, NodeView>();

  constructor(
    nodes: readonly PlacementNode[],
    readonly portRange: PortRange,
  ) {
    this.views = nodes.map((n) => new NodeView(n, portRange));
    for (const v of this.views) this.byName.set(v.name, v);
  }

  get(name: string): NodeView | undefined {
    return this.byName.get(name);
  }

  /** Records a shard already running (or being started) so later placements avoid its GPUs and ports. */
  hold(node: string, profileKey: string, gpus: readonly number[], ports: readonly number[]): void {
    const v = this.byName.get(node);
    if (!v) return;
    v.holdGpus(gpus);
    v.holdPorts(ports);
    v.countShard(profileKey);
  }

  /** Takes what an assignment uses, so the next placement of the pass sees it. */
  reserve(profileKey: string, a: Assignment): void {
    for (const s of a.shards) this.hold(s.node, profileKey, s.gpus, [s.ports.http, ...s.ports.distInit]);
  }
}
