/**
 * The working view of the fleet during one placement or reconcile pass: the
 * snapshot plus everything reserved so far in the pass, so the second
 * replica placed in a pass sees the GPUs and ports the first one took.
 *
 * Mutable by design but free of I/O; a pass builds one, reserves into it
 * and throws it away. The snapshot itself is never modified.
 */
import type { Assignment, PlacementNode, PortRange } from "./types.ts";

export class NodeView {
  readonly allocated: Set<number>;
  readonly ports: Set<number>;
  /** Ports of `ports` inside the range, kept so the port stage is O(1). */
  usedInRange: number;
  /** Shards per profile key on this node, for replica anti-affinity. */
  readonly shardsByProfile = new Map<string, number>();

  constructor(
    readonly node: PlacementNode,
    private readonly range: PortRange,
  ) {
    this.allocated = new Set(node.allocatedGpus);
    this.ports = new Set(node.usedPorts);
    let n = 0;
    for (const p of this.ports) if (p >= range.first && p <= range.last) n++;
    this.usedInRange = n;
  }

  get name(): string {
    return this.node.name;
  }

  get unallocatedCount(): number {
    return this.node.gpus.length - this.allocated.size;
  }

  holdGpus(gpus: Iterable<number>): void {
    for (const g of gpus) this.allocated.add(g);
  }

  holdPorts(ports: Iterable<number>): void {
    for (const p of ports) {
      if (this.ports.has(p)) continue;
      this.ports.add(p);
      if (p >= this.range.first && p <= this.range.last) this.usedInRange++;
    }
  }

  countShard(profileKey: string, delta = 1): void {
    this.shardsByProfile.set(profileKey, (this.shardsByProfile.get(profileKey) ?? 0) + delta);
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
