import { plainEndpoint } from "../../edge/routing/plain-endpoint.ts";
import type { EndpointSpec } from "../../edge/routing/types.ts";

/** `n` interchangeable endpoints in one pool: what the pick and pool round-trip measures route over. */
export function benchEndpoints(n: number): EndpointSpec[] {
  return Array.from({ length: n }, (_, i) => plainEndpoint(`e${i}`, { url: `http://10.0.0.${i}:8000` }));
}
