/**
 * bench:routing's measure of a ModelPool round trip in workerd: one request
 * makes `n` admit + release pairs against a pool of 8 endpoints, in a row
 * or from `c` callers at once, and answers with the wall time they took (Date.now advances across the
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
    const q = new URL(request.url).searchParams;
    const n = Number(q.get("n") ?? 1000);
    // Concurrent callers, as many isolates sending at once would be.
    const c = Number(q.get("c") ?? 1);
    const stub = env.MODEL_POOL.get(env.MODEL_POOL.idFromName("m"));
    await stub.setEndpoints("m", 1, benchEndpoints(8));
    // The version a Worker passes is the one its KV copy holds; here KV has
    // none, and the pool holds the set pushed above.
    const seen = 0;
    const prefix = Array.from({ length: 64 }, (_, i) => 1_000_000 + i);
    const demand = { promptTokens: 1_000, outputTokens: 200 };
    let failed: string | undefined;
    const caller = async (from: number) => {
      for (let i = from; i < n && !failed; i += c) {
        const a = await stub.admit(
          "m",
          {
            id: `r${i}`,
            band: "platinum",
            key: `k${i % c}`,
            policy: "chat",
            session: `s${i % 50}`,
            prefix,
            demand,
          },
          seen,
        );
        if (!a.ok) {
          failed = a.message;
          return;
        }
        await stub.release("m", a.lease.id, { attempts: [{ endpoint: a.lease.endpoint.id, verdict: "ok" }] });
      }
    };
    const t0 = Date.now();
    await Promise.all(Array.from({ length: c }, (_, k) => caller(k)));
    if (failed) return Response.json({ error: failed }, { status: 500 });
    return Response.json({ n, ms: Date.now() - t0 });
  },
} satisfies ExportedHandler<Env>;
