import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { type StartShard, StartShardSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { binaryFor, findBinary, portFree, portsInUse } from "./launch-facts.ts";
import { knownEngines } from "./registry.ts";
import { type LaunchFacts, portsToBind, validateLaunch } from "./validate.ts";

type Init = MessageInitShape<typeof StartShardSchema>;
const spec = (over: Init = {}): StartShard =>
  create(StartShardSchema, {
    replicaId: "r0",
    engine: "vllm",
    model: "m",
    worldNodes: 1,
    gpuIndices: [0, 1],
    tensorParallel: 2,
    pipelineParallel: 1,
    dataParallel: 1,
    ports: { http: 20000, distInit: [20001] },
    minGpuMemoryMib: 40_000n,
    gpuMemoryUtilization: 0.9,
    ...over,
  } as Init);

const gpu = (index: number, free = 80_000, total = 81_559) => ({
  index,
  memoryTotalMib: total,
  memoryFreeMib: free,
});
const facts = (over: Partial<LaunchFacts> = {}): LaunchFacts => ({
  gpus: [gpu(0), gpu(1), gpu(2)],
  portsInUse: [],
  binary: { name: "vllm", found: true },
  ...over,
});
const served = { healthPath: "/health" };
const engines = knownEngines();

describe("validateLaunch", () => {
  it("accepts a spec that fits", () => {
    expect(validateLaunch(spec(), served, facts(), engines)).toEqual([]);
  });

  it("reports every problem at once", () => {
    const problems = validateLaunch(
      spec({ gpuIndices: [1, 7], tensorParallel: 4, minGpuMemoryMib: 60_000n }),
      served,
      facts({ gpus: [gpu(0), gpu(1, 50_000)], portsInUse: [20000], binary: { name: "vllm", found: false } }),
      engines,
    );
    expect(problems.map((p) => p.code)).toEqual([
      "parallel_mismatch",
      "gpu_memory",
      "gpu_memory",
      "gpu_missing",
      "port_in_use",
      "binary_not_found",
    ]);
    const text = problems.map((p) => p.message).join("\n");
    expect(text).toContain(
      "tensor 4 × pipeline 1 × data 1 = 4 GPUs, but the spec gives 2 GPU(s) × 1 node(s) = 2",
    );
    expect(text).toContain("GPU 1: 50000 MiB free, the profile needs 60000 MiB");
    expect(text).toContain("GPU 1: 50000 MiB free, memory utilization 0.9 of 81559 MiB needs 73404 MiB");
    expect(text).toContain("GPU 7 does not exist on this node (GPUs: 0,1)");
    expect(text).toContain("port 20000 is already in use");
    expect(text).toContain('engine binary "vllm" not found');
  });

  it("checks parallel sizes across nodes and the rendezvous of multi-node shards", () => {
    const ok = spec({
      rank: 1,
      worldNodes: 2,
      tensorParallel: 2,
      pipelineParallel: 2,
      peers: [{ rank: 0, address: "10.0.0.5", ports: { http: 20000, distInit: [20001] } }],
    });
    expect(validateLaunch(ok, { healthPath: null }, facts(), engines)).toEqual([]);
    const noHead = spec({ rank: 1, worldNodes: 2, tensorParallel: 2, pipelineParallel: 2 });
    expect(validateLaunch(noHead, { healthPath: null }, facts(), engines).map((p) => p.message)).toEqual([
      "multi-node shard has no rank-0 peer address to rendezvous with",
    ]);
    const badRank = spec({ rank: 2, worldNodes: 2, tensorParallel: 4, dataParallel: 1 });
    expect(validateLaunch(badRank, served, facts(), engines).map((p) => p.code)).toContain("bad_spec");
    const dp = spec({ worldNodes: 2, dataParallel: 2, tensorParallel: 2, ports: { http: 1, distInit: [2] } });
    expect(validateLaunch(dp, served, facts(), engines)).toEqual([]);
    const uneven = spec({
      worldNodes: 2,
      dataParallel: 3,
      tensorParallel: 1,
      ports: { http: 1, distInit: [2] },
    });
    expect(validateLaunch(uneven, served, facts(), engines).map((p) => p.message)).toContain(
      "data parallel 3 does not split evenly over 2 nodes",
    );
  });

  it("knows unknown engines, empty GPU lists, and skips GPU checks without an inventory", () => {
    expect(validateLaunch(spec({ engine: "tgi" }), served, facts(), engines)[0]?.message).toBe(
      'engine "tgi" is not one of vllm, sglang, sim',
    );
    expect(validateLaunch(spec({ gpuIndices: [] }), served, facts(), engines)[0]?.code).toBe(
      "parallel_mismatch",
    );
    expect(validateLaunch(spec({ gpuIndices: [5, 6] }), served, facts({ gpus: null }), engines)).toEqual([]);
    // The sim engine needs no GPU and no memory.
    const sim = spec({ engine: "sim", gpuIndices: [0], tensorParallel: 1, minGpuMemoryMib: 999_999n });
    expect(validateLaunch(sim, served, facts(), engines)).toEqual([]);
  });

  it("binds HTTP on serving ranks and the rendezvous port on rank 0 only", () => {
    expect(portsToBind(spec(), served)).toEqual([20000, 20001]);
    expect(portsToBind(spec({ rank: 1, worldNodes: 2 }), { healthPath: null })).toEqual([]);
  });
});

describe("launch facts", () => {
  it("probes ports", async () => {
    const srv = createServer();
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const busy = (srv.address() as { port: number }).port;
    expect(await portFree(busy)).toBe(false);
    expect(await portsInUse([busy])).toEqual([busy]);
    await new Promise((r) => srv.close(r));
    expect(await portFree(busy)).toBe(true);
  });

  it("finds binaries on PATH or as paths", () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-bin-"));
    writeFileSync(join(dir, "vllm"), "#!/bin/sh\n", { mode: 0o755 });
    writeFileSync(join(dir, "notexec"), "", { mode: 0o644 });
    expect(findBinary("vllm", `/nonexistent:${dir}`)).toBe(join(dir, "vllm"));
    expect(findBinary("notexec", dir)).toBeNull();
    expect(findBinary(join(dir, "vllm"))).toBe(join(dir, "vllm"));
    expect(findBinary("definitely-not-a-binary-xyz")).toBeNull();
    expect(binaryFor("sim", [process.execPath, join(dir, "notexec")]).found).toBe(true);
    expect(binaryFor("vllm", [join(dir, "missing")])).toEqual({ name: join(dir, "missing"), found: false });
  });
});
