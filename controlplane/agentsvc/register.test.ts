import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { ShardLoadReportSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { checkShardLoad } from "./register.ts";

const report = (load: Record<string, unknown>) =>
  create(ShardLoadReportSchema, {
    replicaId: "m/1gpu/0",
    rank: 0,
    load: { waiting: 1, running: 2, ...load },
  });

describe("a shard's load report", () => {
  it("takes an engine's capacity as big as any real one", () => {
    expect(checkShardLoad(report({ maxNumSeqs: 1024, kvCapacityTokens: 4_000_000_000n }))).toBeUndefined();
  });

  it("refuses a capacity the edge could not take, which would hold back every endpoint set", () => {
    expect(checkShardLoad(report({ kvCapacityTokens: 2n ** 60n }))).toMatch(
      /^shard_load\.load\.kvCapacityTokens: /,
    );
    expect(checkShardLoad(report({ maxNumSeqs: 4_000_000_000 }))).toMatch(/^shard_load\.load\.maxNumSeqs: /);
    expect(checkShardLoad(report({ generationTokens: Number.NaN }))).toMatch(/generationTokens/);
  });
});
