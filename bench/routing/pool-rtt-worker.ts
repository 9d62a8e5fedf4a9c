/**
 * bench:routing's measure of a ModelPool round trip in workerd: one request
 * makes `n` admit + release pairs in a row against a pool of 8 endpoints
 * and answers with the wall time they took (Date.now advances across the
 * calls, which are I/O). What a request's two calls cost when the pool is
 * next to the Worker; deployed, the distance to the pool's colo comes on
 * top.
 */
import type { Env } from "../../edge/env.ts";
import { ModelPool } from "../../edge/model-pool.ts";
import { benchEndpoints } from "./endpoints.ts";

export { ModelPool };

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const n = Number(new URL(request.url).searchParams.get("n") ?? 1000);
    const stub = env.MODEL_POOL.get(env.MODEL_POOL.idFromName("m"));
    await stub.setEndpoints("m", 1, benchEndpoints(8));
    // The version a Worker passes is the one its KV copy holds; here KV has
    // none, and the pool holds the set pushed above.
    const seen = 0;
    const prefix = Array.from({ length: 64 }, (_, i) => 1_000_000 + i);
    const t0 = Date.now();
    for (let i = 0; i < n; i++) {
      const a = await stub.admit(
        "m",
        { id: `r${i}`, band: "platinum", key: "k", policy: "chat", session: `s${i % 50}`, prefix },
        seen,
      );
      if (!a.ok) return Response.json({ error: a.message }, { status: 500 });
      await stub.release("m", a.lease.id, { attempts: [{ endpoint: a.lease.endpoint.id, verdict: "ok" }] });
    }
    return Response.json({ n, ms: Date.now() - t0 });
  },
} satisfies ExportedHandler<Env>;
