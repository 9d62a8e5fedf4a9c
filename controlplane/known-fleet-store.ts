import { z } from "zod";
import { OneRowStore } from "./one-row-store.ts";
import type { KnownFleet } from "./reconcile/known-fleet.ts";

/**
 * Where the fleet as it last stood (reconcile/known-fleet.ts) outlives the
 * control plane: one row of JSON in `data_dir/llmgw.db`, validated when read
 * back, because a row written by another version may not fit this one.
 */
const gpuSchema = z.object({
  index: z.number().int().nonnegative(),
  uuid: z.string(),
  name: z.string(),
  memoryTotalMiB: z.number().nonnegative(),
  memoryFreeMiB: z.number().nonnegative(),
  memoryUsedMiB: z.number().nonnegative(),
  pciBusId: z.string(),
  driverVersion: z.string(),
  computeCapability: z.string(),
  foreign: z.array(z.object({ pid: z.number().int(), usedMiB: z.number().nonnegative() })),
});

const port = z.number().int().min(0).max(65_535);

const knownFleetSchema = z.object({
  nodes: z.array(
    z.object({
      name: z.string().min(1),
      agentVersion: z.string(),
      agentInstance: z.string(),
      advertiseAddress: z.string(),
      fabric: z.record(z.string(), z.string()),
      inventory: z.object({
        gpus: z.array(gpuSchema),
        cpuCores: z.number().nonnegative(),
        ramTotalMiB: z.number().nonnegative(),
        hostname: z.string(),
        simulated: z.boolean(),
      }),
    }),
  ),
  replicas: z.array(
    z.object({
      id: z.string().min(1),
      generation: z.number().int().nonnegative(),
      worldNodes: z.number().int().positive(),
      shards: z.array(
        z.object({
          rank: z.number().int().nonnegative(),
          node: z.string().min(1),
          gpus: z.array(z.number().int().nonnegative()),
          ports: z.object({ http: port, distInit: z.array(port) }),
          state: z.enum(["assigned", "starting", "ready", "draining"]),
        }),
      ),
    }),
  ),
});

/** The store: one row, written only when what it holds changed. */
export class KnownFleetStore {
  private readonly row: OneRowStore<string>;
  private written: string | undefined;

  constructor(path: string) {
    this.row = new OneRowStore(path, {
      table: "known_fleet",
      column: "fleet",
      type: "TEXT",
      writtenAt: "saved_at",
    });
  }

  /** Empty with nothing stored; an error names what is wrong with a stored row it cannot use. */
  load(): { fleet: KnownFleet; error?: string } {
    const empty = { nodes: [], replicas: [] };
    const text = this.row.read();
    if (text === undefined) return { fleet: empty };
    this.written = String(text);
    let parsed: unknown;
    try {
      parsed = JSON.parse(this.written);
    } catch (err) {
      return { fleet: empty, error: `known_fleet is not JSON: ${(err as Error).message}` };
    }
    const r = knownFleetSchema.safeParse(parsed);
    if (!r.success) {
      const issue = r.error.issues[0];
      return { fleet: empty, error: `known_fleet.${issue?.path.join(".")}: ${issue?.message}` };
    }
    return { fleet: r.data };
  }

  /** True when it wrote (the fleet changed since the last save or load). */
  save(fleet: KnownFleet, now: number): boolean {
    const text = JSON.stringify(fleet);
    if (text === this.written) return false;
    this.row.write(text, now);
    this.written = text;
    return true;
  }

  close(): void {
    this.row.close();
  }
}
