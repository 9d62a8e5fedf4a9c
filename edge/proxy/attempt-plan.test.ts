import { describe, expect, it } from "vitest";
import { errors } from "../openai-errors.ts";
import { ClientGone, type PoolLease } from "../pool/client.ts";
import { plainEndpoint } from "../routing/plain-endpoint.ts";
import type { EndpointSpec } from "../routing/types.ts";
import { AttemptPlan } from "./attempt-plan.ts";

const ep = (id: string): EndpointSpec => plainEndpoint(id);

function lease(model: string, ids: string[], settled: string[]): PoolLease {
  const [first, ...rest] = ids.map(ep);
  return {
    lease: {
      id: `${model}-lease`,
      endpoint: first!,
      alternates: rest,
      route: "load",
      band: "gold",
      queuedMs: 0,
      saturation: 0,
    },
    model,
    failOpen: false,
    prefilled: () => {},
    record: () => {},
    settle: async () => {
      settled.push(model);
    },
  };
}

async function drain(plan: AttemptPlan): Promise<string[]> {
  const out: string[] = [];
  for (let t = await plan.take(); t; t = await plan.take()) out.push(`${t.model}:${t.endpoint.id}`);
  return out;
}

describe("AttemptPlan", () => {
  it("tries the lease's endpoint and alternates, then asks the fallback's pool; each endpoint once; settles every lease", async () => {
    const settled: string[] = [];
    const asked: string[] = [];
    const plan = new AttemptPlan(["big", "small"], async (m) => {
      asked.push(m);
      return m === "big" ? lease("big", ["a", "b"], settled) : lease("small", ["b", "c"], settled);
    });
    await plan.start();
    expect(asked).toEqual(["big"]);
    expect(await drain(plan)).toEqual(["big:a", "big:b", "small:c"]);
    expect(asked).toEqual(["big", "small"]);
    await plan.settle();
    expect(settled.sort()).toEqual(["big", "small"]);
  });

  it("admission moves on to a fallback when a pool refuses, and throws the last refusal when all do", async () => {
    const settled: string[] = [];
    const plan = new AttemptPlan(["big", "small"], async (m) => {
      if (m === "big") throw errors.rateLimited("queue full", "queue_full", 1000);
      return lease("small", ["c"], settled);
    });
    expect((await plan.start()).model).toBe("small");
    const none = new AttemptPlan(["big"], async () => {
      throw errors.noCapacity("no endpoints", "no_endpoints");
    });
    await expect(none.start()).rejects.toMatchObject({ status: 503, code: "no_endpoints" });
  });

  it("a client that left stops the plan at once", async () => {
    const plan = new AttemptPlan(["big", "small"], async () => {
      throw new ClientGone();
    });
    await expect(plan.start()).rejects.toBeInstanceOf(ClientGone);
  });
});
