import { DEFAULT_SPILL_GROUP } from "../../common/endpoint-fields.ts";
import type { EndpointSpec } from "./types.ts";

/**
 * An endpoint as an endpoint file gives one with only an id and a URL:
 * reached directly, in the default spill group, priority 0, weight 1. Tests
 * and the routing benches build their fleets from it, so a new required
 * field of EndpointSpec is added here once rather than in every fleet.
 */
export function plainEndpoint(id: string, extra: Partial<EndpointSpec> = {}): EndpointSpec {
  return {
    id,
    url: `http://${id}`,
    spillGroup: DEFAULT_SPILL_GROUP,
    priority: 0,
    weight: 1,
    via: "direct",
    ...extra,
  };
}
