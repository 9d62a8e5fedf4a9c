/**
 * The catalog's naming contract, one validator for both sides of EdgeSync:
 * the control plane checks its config with it, and the edge checks every
 * catalog pushed to it, so the edge refuses what the control plane refuses,
 * with the same path-named messages (docs/placement.md, docs/edge.md).
 */
import { z } from "zod";

/** What a client may put in `model`: no spaces or control characters, so never a header's worth of tricks. */
export const modelNameSchema = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:/-]*$/, "must be letters, digits and . _ : / -");

/** The part of a catalog model the naming rules look at. */
export interface NamedModel {
  readonly name: string;
  readonly aliases: readonly string[];
  readonly fallbacks: readonly string[];
}

export interface CatalogNames {
  /** Path-named problems, in model order; empty when the names hold. */
  issues: string[];
  /** The index of the model a name or alias belongs to. */
  canonical(name: string): number | undefined;
}

/**
 * Names and aliases unique across models, fallbacks that exist and are not
 * the model itself, and no fallback cycle (a failing request would bounce
 * between the models forever). Each stage records every problem it finds.
 */
export function checkCatalogNames(models: readonly NamedModel[]): CatalogNames {
  const issues: string[] = [];
  const owner = new Map<string, { model: number; what: string }>();
  // Names first, so alias and fallback checks can refer to them.
  models.forEach((m, i) => {
    const prev = owner.get(m.name);
    if (prev) issues.push(`models[${i}].name: "${m.name}" is already ${prev.what} of models[${prev.model}]`);
    else owner.set(m.name, { model: i, what: "the name" });
  });
  models.forEach((m, i) => {
    m.aliases.forEach((a, j) => {
      const path = `models[${i}].aliases[${j}]`;
      if (a === m.name) {
        issues.push(`${path}: "${a}" repeats the model's own name`);
        return;
      }
      const prev = owner.get(a);
      if (prev) {
        issues.push(
          prev.model === i
            ? `${path}: "${a}" is listed twice`
            : `${path}: "${a}" is already ${prev.what} of models[${prev.model}] (${models[prev.model]!.name})`,
        );
      } else owner.set(a, { model: i, what: "an alias" });
    });
  });
  const canonical = (n: string): number | undefined => owner.get(n)?.model;

  const edges: number[][] = models.map(() => []);
  models.forEach((m, i) => {
    m.fallbacks.forEach((f, j) => {
      const path = `models[${i}].fallbacks[${j}]`;
      const target = canonical(f);
      if (target === undefined) issues.push(`${path}: unknown model "${f}"`);
      else if (target === i) issues.push(`${path}: "${f}" is this model itself`);
      else edges[i]!.push(target);
    });
  });
  for (const cycle of findCycles(edges)) {
    const names = [...cycle, cycle[0]!].map((k) => models[k]!.name).join(" → ");
    issues.push(`models[${cycle[0]}].fallbacks: fallback cycle ${names}`);
  }
  return { issues, canonical };
}

/** Elementary cycles, each reported once (from its smallest member), via DFS colouring. */
function findCycles(edges: number[][]): number[][] {
  const cycles: number[][] = [];
  const seen = new Set<string>();
  const state = edges.map(() => 0); // 0 new, 1 on stack, 2 done
  const stack: number[] = [];
  const visit = (v: number): void => {
    state[v] = 1;
    stack.push(v);
    for (const w of edges[v]!) {
      if (state[w] === 1) {
        const cycle = stack.slice(stack.indexOf(w));
        const start = cycle.indexOf(Math.min(...cycle));
        const norm = [...cycle.slice(start), ...cycle.slice(0, start)];
        const key = norm.join(",");
        if (!seen.has(key)) {
          seen.add(key);
          cycles.push(norm);
        }
      } else if (state[w] === 0) visit(w);
    }
    stack.pop();
    state[v] = 2;
  };
  edges.forEach((_, v) => {
    if (state[v] === 0) visit(v);
  });
  return cycles;
}
