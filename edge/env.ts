import type { KeyLedger } from "./keys/ledger.ts";
import type { RevocationLog } from "./keys/revocations.ts";
import type { ModelPool } from "./pool/model-pool.ts";

/** The Worker's bindings, as wrangler.toml declares them. */
export interface Env {
  LLMGW_KV: KVNamespace;
  KEY_LEDGER: DurableObjectNamespace<KeyLedger>;
  REVOCATIONS: DurableObjectNamespace<RevocationLog>;
  MODEL_POOL: DurableObjectNamespace<ModelPool>;
  /** Bearer secret for EdgeSync (a Worker secret; locally `--var`). Unset: EdgeSync refuses every call. */
  EDGE_SYNC_TOKEN?: string;
  /** A second EdgeSync secret, accepted as well while the token is rotated; never on its own. */
  EDGE_SYNC_TOKEN_NEXT?: string;
  /** Each site's EdgeSync token, `{"eu": "TOKEN", "us": ["NEW", "OLD"]}`: it writes only that site's endpoint set and load (docs/sites.md). */
  EDGE_SYNC_SITE_TOKENS?: string;
  /** JSON laid over the router settings stored by EdgeSync (local override; see edge/config/settings.ts). */
  LLMGW_ROUTER?: string;
  /** "1": the `x-llmgw-location` header stands in for `request.cf`'s location (local runs and tests only; edge/location.ts). */
  LLMGW_LOCATION_HEADER?: string;
  /** Where new ModelPool objects are created: a locationHint (`enam`, `weur`, …) near the GPUs. */
  LLMGW_POOL_LOCATION?: string;
  /** Name of the Workers VPC network binding used by `via: vpc` endpoints. */
  LLMGW_VPC_BINDING?: string;
  /** Access service token added to requests for `via: tunnel` endpoints. */
  CF_ACCESS_CLIENT_ID?: string;
  CF_ACCESS_CLIENT_SECRET?: string;
}
