import type { EndpointSpec } from "../../edge/routing/types.ts";

/** `n` interchangeable endpoints in one pool: what the pick and pool round-trip measures route over. */
export function benchEndpoints(n: number): EndpointSpec[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `e${i}`,
    url: `http://10.0.0.${i}:8000`,
    spillGroup: "default",
    priority: 0,
    weight: 1,
    via: "direct" as const,
  }));
}
