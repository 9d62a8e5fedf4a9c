/**
 * bench:routing's measure of a ModelPool in workerd: `n` requests, each an
 * admit and a release, against a real pool of 8 endpoints, from `c`
 * callers at once spread over `isolates` simulated isolates, and answers
 * with the wall time they took and the calls the pool received (Date.now
 * advances across the calls, which are I/O).
 *
 * `mode=channel` is the edge as it runs: one PoolChannel per isolate,
 * coalescing its requests' calls. `mode=per-request` is the design before
 * it: every request its own channel, so every admit and every release is a
 * call of its own. A caller does not wait for its release before its next
 * admit, as a Worker releases in waitUntil.
 */
import type { Env } from "../../edge/env.ts";
import { ModelPool } from "../../edge/pool/model-pool.ts";
import { PoolChannel } from "../../edge/routing/pool-channel.ts";
import { POLL_HOLD_MS } from "../../edge/routing/pool-exchange.ts";
import { benchEndpoints } from "./endpoints.ts";

export { ModelPool };

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const q = new URL(request.url).searchParams;
    const n = Number(q.get("n") ?? 1000);
    const c = Number(q.get("c") ?? 1);
    const isolates = Number(q.get("isolates") ?? 1);
    const perRequest = q.get("mode") === "per-request";
    const stub = env.MODEL_POOL.get(env.MODEL_POOL.idFromName("m"));
    await stub.setEndpoints("m", 1, benchEndpoints(8));
    const channel = (id: string = crypto.randomUUID()): PoolChannel =>
      new PoolChannel({
        id,
        send: (ex) => stub.exchange("m", ex),
        answerWithinMs: 10_000,
        pollHoldMs: POLL_HOLD_MS,
      });
    const shared = Array.from({ length: isolates }, (_, k) => channel(`isolate-${k}`));
    const used: PoolChannel[] = [...shared];
    const prefix = Array.from({ length: 64 }, (_, i) => 1_000_000 + i);
    const demand = { promptTokens: 1_000, outputTokens: 200 };
    const releases: Promise<void>[] = [];
    let failed: string | undefined;
    const caller = async (from: number) => {
      for (let i = from; i < n && !failed; i += c) {
        let ch = shared[i % isolates]!;
        if (perRequest) {
          // Named as its isolate's, so the pool keeps one mailbox per isolate as deployed.
          ch = channel(`isolate-${i % isolates}`);
          used.push(ch);
        }
        // The version a Worker passes is the one its KV copy holds; here KV
        // has none, and the pool holds the set pushed above.
        const a = await ch.admit(
          {
            id: `r${i}`,
            band: "platinum",
            key: `k${i % c}`,
            policy: "chat",
            session: `s${i % 50}`,
            prefix,
            demand,
          },
          0,
        );
        if (!a.ok) {
          failed = a.message;
          return;
        }
        releases.push(
          ch.release(a.lease.id, { attempts: [{ endpoint: a.lease.endpoint.id, verdict: "ok" }] }),
        );
      }
    };
    const t0 = Date.now();
    await Promise.all(Array.from({ length: c }, (_, k) => caller(k)));
    await Promise.all(releases);
    const ms = Date.now() - t0;
    if (failed) return Response.json({ error: failed }, { status: 500 });
    return Response.json({ n, ms, calls: used.reduce((sum, ch) => sum + ch.calls, 0) });
  },
} satisfies ExportedHandler<Env>;
