/**
 * What every form of an endpoint shares — the edge's endpoint record, a
 * static endpoint (config file or `ctl endpoints set`) and the control
 * plane's endpoint config — so the edge refuses what the control plane
 * refuses, with the same words.
 *
 * The config key `pool` names the endpoint's spill group: endpoints in
 * groups of one priority each, a lower-priority group taking requests only
 * while no higher one can (docs/routing.md, "Picking"). It is not the
 * model's pool at the edge (the ModelPool that holds every endpoint); the
 * key keeps its name for the config files and EdgeSync messages that carry it.
 */
import { z } from "zod";

/** How the edge reaches an engine (edge/proxy/upstream.ts): the public URL, a Workers VPC binding, or an Access-protected tunnel. */
export const viaSchema = z.enum(["direct", "vpc", "tunnel"]);

/** The spill group of an endpoint whose `pool` is unset or empty. */
export const DEFAULT_SPILL_GROUP = "default";

/**
 * Spill-over goes group by group in priority order, so a spill group has one
 * priority: the index and message of every endpoint that breaks that.
 */
export function spillGroupPriorityConflicts(
  list: readonly { pool?: string | undefined; priority?: number | undefined }[],
): { index: number; message: string }[] {
  const seen = new Map<string, number>();
  const out: { index: number; message: string }[] = [];
  list.forEach((e, index) => {
    const group = e.pool || DEFAULT_SPILL_GROUP;
    const priority = e.priority ?? 0;
    const p = seen.get(group);
    if (p === undefined) seen.set(group, priority);
    else if (p !== priority)
      out.push({ index, message: `spill group (pool) "${group}" already has priority ${p}` });
  });
  return out;
}
