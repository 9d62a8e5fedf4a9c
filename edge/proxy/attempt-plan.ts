/**
 * Which endpoints a request may try, in order: the model's pool grants a
 * lease (an endpoint and its ranked alternates, up to `router.retries`), and
 * when those are spent the next fallback model's pool is asked. Each pool is
 * called once per request; an endpoint is never tried twice. The plan holds
 * every lease it took and settles each exactly once.
 */
import type { ApiError } from "../openai-errors.ts";
import { ClientGone, type PoolLease } from "../pool/client.ts";
import type { EndpointSpec } from "../routing/types.ts";

export interface Target {
  model: string;
  endpoint: EndpointSpec;
  lease: PoolLease;
}

export type AdmitFor = (model: string) => Promise<PoolLease>;

export class AttemptPlan {
  private readonly leases: PoolLease[] = [];
  private readonly tried = new Set<string>();
  private queue: EndpointSpec[] = [];
  private current: PoolLease | undefined;
  private next = 0;
  /** The last pool refusal, for when nothing could be tried at all. */
  refusal: ApiError | undefined;

  constructor(
    private readonly chain: readonly string[],
    private readonly admitFor: AdmitFor,
  ) {}

  /**
   * Admission: asks the chain's pools in order until one grants a lease.
   * Throws the last refusal if none does (or ClientGone).
   */
  async start(): Promise<PoolLease> {
    const lease = await this.admitNext();
    if (!lease) throw this.refusal!;
    return lease;
  }

  private async admitNext(): Promise<PoolLease | undefined> {
    while (this.next < this.chain.length) {
      const model = this.chain[this.next++]!;
      try {
        const lease = await this.admitFor(model);
        this.leases.push(lease);
        this.current = lease;
        this.queue = [lease.lease.endpoint, ...lease.lease.alternates];
        return lease;
      } catch (err) {
        if (err instanceof ClientGone) throw err;
        this.refusal = err as ApiError;
      }
    }
    return undefined;
  }

  /** The next endpoint to try, moving on to a fallback model's pool when this lease's endpoints are spent. */
  async take(): Promise<Target | undefined> {
    for (;;) {
      const lease = this.current;
      if (lease) {
        for (let e = this.queue.shift(); e; e = this.queue.shift()) {
          if (this.tried.has(e.id)) continue;
          this.tried.add(e.id);
          return { model: lease.model, endpoint: e, lease };
        }
      }
      if (!(await this.admitNext())) return undefined;
    }
  }

  /** Releases every lease taken, once each. */
  settle(): Promise<unknown> {
    return Promise.all(this.leases.map((l) => l.settle()));
  }
}
