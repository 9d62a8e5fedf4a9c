/**
 * Which ports a shard needs, by engine, and how they are drawn from
 * `control.port_range`. The range should sit outside the kernel's ephemeral
 * range (32768-60999 on Linux): an engine port that an outgoing connection
 * already took fails the engine only after its weights have loaded.
 *
 * Every rank gets an engine HTTP port. On top of that:
 *
 * - vLLM (and the sim engine):
 *   - one node, dp = 1: nothing extra. Tensor/pipeline parallel inside one
 *     node rendezvous over ports vLLM asks the kernel for itself.
 *   - several nodes, dp = 1 (tensor and pipeline parallel span them): rank 0
 *     binds `--master-port` (torch's TCPStore); the other ranks only dial
 *     it, so they get no extra port.
 *   - dp > 1: rank 0 binds `--data-parallel-rpc-port` and the band of 10
 *     ports vLLM reserves upward of `VLLM_DP_MASTER_PORT`. Their defaults
 *     (29550, 29500) would collide between two replicas on one node. Over
 *     several nodes the data-parallel ranks meet there, not at a master
 *     port, so there is none.
 *   Order in `distInit`: [master_port] or [dp_rpc_port, dp_master_port .. +9].
 * - SGLang: a contiguous block starting at the `--dist-init-addr` port, of
 *   9 + dp ports, because SGLang derives its ZMQ ports (detokenizer, rpc,
 *   metrics, scheduler inputs per dp rank) from that port + 1…. We always pass
 *   the address, even on one node, since its default (port + 233) would land
 *   outside the range. All ranks are handed the same numbers, and non-zero
 *   ranks bind some of the derived ports, so the block is reserved on every
 *   rank at one common base.
 */
import type { PlacementProfile, PortRange } from "./types.ts";

/** Only membership is needed, so a view can combine the snapshot's ports with a pass's own. */
export interface PortSet {
  has(port: number): boolean;
}

export const VLLM_DP_MASTER_BAND = 10;
export const SGLANG_BLOCK_BASE = 9;

export interface PortNeeds {
  /** Extra contiguous ports on rank 0 beyond HTTP. */
  rank0Block: number;
  /** Extra contiguous ports on other ranks beyond HTTP. */
  otherBlock: number;
  /** The extra block must start at the same port on every rank. */
  commonBase: boolean;
}

export function portNeeds(p: Pick<PlacementProfile, "engine" | "nodes" | "dataParallel">): PortNeeds {
  if (p.engine === "sglang") {
    const block = SGLANG_BLOCK_BASE + p.dataParallel;
    return { rank0Block: block, otherBlock: p.nodes > 1 ? block : 0, commonBase: p.nodes > 1 };
  }
  const master = p.nodes > 1 && p.dataParallel === 1 ? 1 : 0;
  const dp = p.dataParallel > 1 ? 1 + VLLM_DP_MASTER_BAND : 0;
  return { rank0Block: master + dp, otherBlock: 0, commonBase: false };
}

/** Ports a node must have free to be any rank of the profile (rank 0 is the most demanding). */
export function portsPerNode(needs: PortNeeds): number {
  return 1 + Math.max(needs.rank0Block, needs.otherBlock);
}

/** The lowest free port in range, or undefined. */
export function lowestFree(used: PortSet, range: PortRange, from = range.first): number | undefined {
  for (let p = from; p <= range.last; p++) if (!used.has(p)) return p;
  return undefined;
}

/** The lowest base of `size` contiguous ports free in every set, or undefined. */
export function lowestFreeBlock(
  used: readonly PortSet[],
  size: number,
  range: PortRange,
  avoid: ReadonlySet<number> = new Set(),
): number | undefined {
  if (size <= 0) return undefined;
  let run = 0;
  for (let p = range.first; p <= range.last; p++) {
    const free = !avoid.has(p) && used.every((u) => !u.has(p));
    run = free ? run + 1 : 0;
    if (run === size) return p - size + 1;
  }
  return undefined;
}

/** True when the node can give `1 + block` ports with the block contiguous and apart from one HTTP port. */
export function hasRoom(used: PortSet, usedInRange: number, range: PortRange, block: number): boolean {
  const size = range.last - range.first + 1;
  if (size - usedInRange < 1 + block) return false;
  if (block === 0) return true;
  const base = lowestFreeBlock([used], block, range);
  if (base === undefined) return false;
  // Some free port outside the block must remain for HTTP.
  return size - usedInRange - block >= 1;
}
