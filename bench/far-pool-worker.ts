/**
 * bench:edge's edge with its model pools a distance away: the edge itself,
 * except that every call to a pool waits BENCH_POOL_RTT_MS (half each way)
 * before it is handled and before its answer returns, as a pool in another
 * Cloudflare location would. What a far client's Worker pays without
 * `[placement]`, and what placement next to the pool gives back
 * (docs/deploy.md). With BENCH_POOL_SAYS_BUSY every answer says the pool is
 * busy, so the Workers' channels never pipeline admits (docs/routing.md,
 * "A far pool"): the design before, side by side.
 */
import { ModelPool as NearPool } from "../edge/pool/model-pool.ts";
import type { Exchange, ExchangeAnswer } from "../edge/routing/pool-protocol.ts";
import edge from "../edge/worker.ts";

export { KeyLedger } from "../edge/keys/ledger.ts";
export { RevocationLog } from "../edge/keys/revocations.ts";

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class ModelPool extends NearPool {
  override async exchange(model: string, ex: Exchange): Promise<ExchangeAnswer> {
    const env = this.env as { BENCH_POOL_RTT_MS?: string; BENCH_POOL_SAYS_BUSY?: string };
    const oneWay = Number(env.BENCH_POOL_RTT_MS ?? 0) / 2;
    await delay(oneWay);
    const answer = await super.exchange(model, ex);
    await delay(oneWay);
    return env.BENCH_POOL_SAYS_BUSY ? { ...answer, busy: true } : answer;
  }
}

export default edge;
