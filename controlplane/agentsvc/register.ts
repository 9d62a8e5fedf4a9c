import { z } from "zod";
import { inventoryFromProto } from "../../common/inventory.ts";
import {
  type Register,
  type ShardLoadReport,
  ShardState,
  type ShardStatus,
} from "../../proto/gen/agent/v1/agent_pb.ts";
import type { RegistrationInfo } from "../registry.ts";

/**
 * A Register message is the agent's word about its node. It is bounded and
 * checked field by field, so a broken agent gets a precise rejection and
 * cannot make the control plane hold unbounded or nonsensical state.
 */
const label = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[A-Za-z0-9._/-]+$/, "letters, digits and . _ / - only");

export const NODE_NAME = /^[A-Za-z0-9]([A-Za-z0-9._-]{0,62})$/;

const text = (max: number) => z.string().max(max);
const finite = z.number().refine(Number.isFinite, "must be a finite number");
const ports = z.object({
  http: z.number().max(65535),
  distInit: z.array(z.number().max(65535)).max(64),
});

// A shard report changes the replica table, so it is bounded like Register:
// a broken agent is told which field is wrong instead of filling memory.
const shardStatusSchema = z.object({
  replicaId: z
    .string()
    .min(1, "replica id is required")
    .max(256)
    .regex(/^[\x21-\x7e]+$/, "printable ASCII without spaces"),
  rank: z.number().max(1023),
  state: z.enum(ShardState),
  reason: text(4096),
  outputTail: z.array(text(4096)).max(200),
  spec: z
    .object({
      replicaId: text(256),
      engine: text(64),
      model: text(1024),
      servedModelName: text(256),
      profile: text(256),
      args: z.array(text(4096)).max(256),
      env: z
        .record(text(256), text(4096))
        .refine((e) => Object.keys(e).length <= 256, "at most 256 variables"),
      gpuIndices: z.array(z.number().max(1023)).max(256),
      ports: ports.optional(),
      peers: z.array(z.object({ nodeName: text(63), address: text(255), ports: ports.optional() })).max(256),
      worldNodes: z.number().max(1024),
      mgmtInterface: text(64),
    })
    .optional(),
});

// Load goes to the board the edge routes by: bounded, finite, fractions in
// 0..1. Capacity is published to the edge as it came, and the edge refuses a
// whole endpoint set over one figure past what a JSON number holds exactly,
// so one broken agent must not get such a figure past here.
const shardLoadSchema = z.object({
  replicaId: shardStatusSchema.shape.replicaId,
  rank: shardStatusSchema.shape.rank,
  load: z.object({
    waiting: finite.min(0),
    running: finite.min(0),
    kvUsage: finite.min(0).max(1),
    prefixCacheHitRate: finite.min(0).max(1),
    generationTokens: finite.min(0),
    maxNumSeqs: z.number().max(1 << 20, "at most 1048576 sequences"),
    kvCapacityTokens: z.bigint().max(BigInt(Number.MAX_SAFE_INTEGER), "at most 2^53-1 tokens"),
  }),
});

/** Undefined when `s` is a well-formed shard report, else the first problem, path-named. */
export function checkShardStatus(s: ShardStatus, path = "shard_status"): string | undefined {
  return firstProblem(shardStatusSchema.safeParse(s), path);
}

/** Undefined when `s` is a well-formed load report, else the first problem, path-named. */
export function checkShardLoad(s: ShardLoadReport, path = "shard_load"): string | undefined {
  return firstProblem(shardLoadSchema.safeParse(s), path);
}

function firstProblem(parsed: z.ZodSafeParseResult<unknown>, path: string): string | undefined {
  if (parsed.success) return undefined;
  const i = parsed.error.issues[0]!;
  return `${path}.${i.path.join(".")}: ${i.message}`;
}

const registerSchema = z.object({
  nodeName: z
    .string()
    .regex(NODE_NAME, "node name must be 1-63 letters, digits, . _ -, starting alphanumeric"),
  agentVersion: z.string().max(64),
  agentInstance: z.string().min(1, "agent instance id is required").max(64),
  advertiseAddress: z.string().max(255),
  fabric: z
    .record(label, z.string().max(63))
    .refine((f) => Object.keys(f).length <= 32, "at most 32 fabric labels"),
  inventory: z.object({
    gpus: z
      .array(
        z.object({
          index: z.number().int().min(0).max(1023),
          uuid: z.string().min(1).max(128),
          name: z.string().max(128),
          memoryTotalMib: z.bigint(),
          memoryFreeMib: z.bigint(),
          memoryUsedMib: z.bigint(),
          pciBusId: z.string().max(64),
          driverVersion: z.string().max(64),
          computeCapability: z.string().max(16),
          foreign: z.array(z.object({ pid: z.number(), usedMib: z.bigint() })).max(256),
        }),
      )
      .max(256),
    cpuCores: z.number().int().min(0),
    ramTotalMib: z.bigint(),
    hostname: z.string().max(255),
    simulated: z.boolean(),
  }),
  shards: z.array(z.unknown()).max(1024),
});

export type RegisterCheck = { ok: true; info: RegistrationInfo } | { ok: false; reason: string };

export function checkRegister(msg: Register): RegisterCheck {
  if (!msg.inventory) return { ok: false, reason: "register.inventory: missing" };
  const problem = firstProblem(registerSchema.safeParse(msg), "register");
  if (problem) return { ok: false, reason: problem };
  for (const [i, shard] of msg.shards.entries()) {
    const problem = checkShardStatus(shard, `register.shards[${i}]`);
    if (problem) return { ok: false, reason: problem };
  }
  const inv = msg.inventory;
  const indices = new Set(inv.gpus.map((g) => g.index));
  if (indices.size !== inv.gpus.length)
    return { ok: false, reason: "register.inventory.gpus: duplicate GPU index" };
  for (const g of inv.gpus) {
    if (g.memoryFreeMib > g.memoryTotalMib) {
      return { ok: false, reason: `register.inventory.gpus[${g.index}]: free memory exceeds total` };
    }
  }
  return {
    ok: true,
    info: {
      name: msg.nodeName,
      agentVersion: msg.agentVersion,
      agentInstance: msg.agentInstance,
      advertiseAddress: msg.advertiseAddress,
      fabric: { ...msg.fabric },
      inventory: inventoryFromProto(inv),
    },
  };
}
