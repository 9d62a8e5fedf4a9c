import { app } from "./app.ts";
import type { Env } from "./env.ts";

export { KeyLedger } from "./keys/ledger.ts";
export { RevocationLog } from "./keys/revocations.ts";
export { ModelPool } from "./pool/model-pool.ts";

export default {
  fetch: (request, env, ctx) => app.fetch(request, env, ctx),
} satisfies ExportedHandler<Env>;
