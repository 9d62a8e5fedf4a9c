import { app } from "./app.ts";
import type { Env } from "./env.ts";

export { KeyLedger } from "./key-ledger.ts";
export { ModelPool } from "./model-pool.ts";
export { RevocationLog } from "./revocations.ts";

export default {
  fetch: (request, env, ctx) => app.fetch(request, env, ctx),
} satisfies ExportedHandler<Env>;
