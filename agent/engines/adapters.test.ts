import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { ownedArg, ownedEnv, RETUNABLE_ENV } from "../../common/engine-args.ts";
import { type StartShard, StartShardSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { redacted } from "./adapter.ts";
import { sglangAdapter } from "./sglang.ts";
import { LLMGW_ENTRY, simAdapter } from "./sim.ts";
import { vllmAdapter } from "./vllm.ts";

type Init = MessageInitShape<typeof StartShardSchema>;

function spec(over: Init = {}): StartShard {
  return create(StartShardSchema, {
    replicaId: "llama-8b-0",
    rank: 0,
    worldNodes: 1,
    engine: "vllm",
    model: "meta-llama/Llama-3.1-8B-Instruct",
    servedModelName: "llama-8b",
    gpuIndices: [0],
    ports: { http: 20000, distInit: [20001] },
    tensorParallel: 1,
    pipelineParallel: 1,
    dataParallel: 1,
    gpuMemoryUtilization: 0.9,
    ...over,
  } as Init);
}

const node = { advertiseAddress: "10.0.0.5", mgmtInterface: "eth0" };

// Two nodes, 8 GPUs each: tensor parallel 8 within a node, pipeline across.
function twoNodeSpec(rank: number, engine = "vllm"): StartShard {
  return spec({
    replicaId: "llama-405b-0",
    engine,
    model: "meta-llama/Llama-3.1-405B-Instruct",
    servedModelName: "llama-405b",
    rank,
    worldNodes: 2,
    gpuIndices: [0, 1, 2, 3, 4, 5, 6, 7],
    tensorParallel: 8,
    pipelineParallel: 2,
    ports: rank === 0 ? { http: 20010, distInit: [20011] } : { http: 20020, distInit: [20021] },
    peers: [
      { rank: 0, nodeName: "gpu-a", address: "10.0.0.5", ports: { http: 20010, distInit: [20011] } },
      { rank: 1, nodeName: "gpu-b", address: "10.0.0.6", ports: { http: 20020, distInit: [20021] } },
    ],
    mgmtInterface: "ib0",
  });
}

/** Rank 0's data-parallel ports as placement hands them out: the RPC port, then a band of 10. */
function band(from: number): number[] {
  return Array.from({ length: 11 }, (_, i) => from + i);
}

// Two nodes, 8 GPUs each: four data-parallel ranks of tensor parallel 4, two on each node.
function twoNodeDataParallel(rank: number): StartShard {
  const ports = [
    { http: 20010, distInit: band(20011) },
    { http: 20020, distInit: [] },
  ];
  return spec({
    replicaId: "llama-70b-0",
    model: "meta-llama/Llama-3.1-70B-Instruct",
    servedModelName: "llama-70b",
    rank,
    worldNodes: 2,
    gpuIndices: [0, 1, 2, 3, 4, 5, 6, 7],
    tensorParallel: 4,
    dataParallel: 4,
    ports: ports[rank],
    peers: [
      { rank: 0, nodeName: "gpu-a", address: "10.0.0.5", ports: ports[0] },
      { rank: 1, nodeName: "gpu-b", address: "10.0.0.6", ports: ports[1] },
    ],
  });
}

describe("vllm adapter", () => {
  it("one GPU", () => {
    const l = vllmAdapter.build(spec({ args: ["--max-model-len", "8192"] }), node);
    expect(l.argv.join(" ")).toBe(
      "vllm serve meta-llama/Llama-3.1-8B-Instruct --host 10.0.0.5 --port 20000 --served-model-name llama-8b " +
        "--tensor-parallel-size 1 --pipeline-parallel-size 1 --gpu-memory-utilization 0.9 --max-model-len 8192",
    );
    expect(l.env).toEqual({ CUDA_VISIBLE_DEVICES: "0", CUDA_DEVICE_ORDER: "PCI_BUS_ID" });
    expect([l.probeHost, l.port, l.healthPath, l.metricsPath]).toEqual([
      "10.0.0.5",
      20000,
      "/health",
      "/metrics",
    ]);
    expect(l.metricNames.waiting).toBe("vllm:num_requests_waiting");
  });

  it("tensor parallel 8, data parallel when > 1 on its placed ports, configured binary, spec env wins", () => {
    const l = vllmAdapter.build(
      spec({
        gpuIndices: [0, 1, 2, 3, 4, 5, 6, 7],
        tensorParallel: 4,
        dataParallel: 2,
        ports: { http: 20000, distInit: band(20001) },
        gpuMemoryUtilization: 0.85,
        env: { HF_HUB_OFFLINE: "1", CUDA_DEVICE_ORDER: "FASTEST_FIRST" },
      }),
      { ...node, bin: "/opt/vllm/bin/vllm", listenHost: "0.0.0.0" },
    );
    expect(l.argv).toEqual([
      "/opt/vllm/bin/vllm",
      "serve",
      "meta-llama/Llama-3.1-8B-Instruct",
      "--host",
      "0.0.0.0",
      "--port",
      "20000",
      "--served-model-name",
      "llama-8b",
      "--tensor-parallel-size",
      "4",
      "--pipeline-parallel-size",
      "1",
      "--data-parallel-size",
      "2",
      "--data-parallel-rpc-port",
      "20001",
      "--gpu-memory-utilization",
      "0.85",
    ]);
    expect(l.env).toEqual({
      CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7",
      CUDA_DEVICE_ORDER: "FASTEST_FIRST",
      HF_HUB_OFFLINE: "1",
      VLLM_DP_MASTER_PORT: "20002",
    });
    expect(l.probeHost).toBe("127.0.0.1");
  });

  it("tensor parallel 8", () => {
    const l = vllmAdapter.build(spec({ gpuIndices: [0, 1, 2, 3, 4, 5, 6, 7], tensorParallel: 8 }), node);
    expect(l.argv.slice(9, 13)).toEqual(["--tensor-parallel-size", "8", "--pipeline-parallel-size", "1"]);
    expect(l.argv).not.toContain("--data-parallel-size");
    expect(l.argv).not.toContain("--nnodes");
  });

  it("pipeline parallel 2 across two nodes: rank 0 is the head", () => {
    const l = vllmAdapter.build(twoNodeSpec(0), node);
    expect(l.argv.join(" ")).toBe(
      "vllm serve meta-llama/Llama-3.1-405B-Instruct --host 10.0.0.5 --port 20010 --served-model-name llama-405b " +
        "--tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 --node-rank 0 " +
        "--master-addr 10.0.0.5 --master-port 20011 --gpu-memory-utilization 0.9",
    );
    expect(l.env).toEqual({
      CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7",
      CUDA_DEVICE_ORDER: "PCI_BUS_ID",
      NCCL_SOCKET_IFNAME: "=ib0",
      GLOO_SOCKET_IFNAME: "ib0",
      VLLM_HOST_IP: "10.0.0.5",
    });
    expect(l.healthPath).toBe("/health");
  });

  it("pipeline parallel 2 across two nodes: rank 1 is headless and dials the head", () => {
    const l = vllmAdapter.build(twoNodeSpec(1), { advertiseAddress: "10.0.0.6", mgmtInterface: "eth0" });
    expect(l.argv.join(" ")).toBe(
      "vllm serve meta-llama/Llama-3.1-405B-Instruct --host 10.0.0.6 --port 20020 --served-model-name llama-405b " +
        "--tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 --node-rank 1 " +
        "--master-addr 10.0.0.5 --master-port 20011 --headless --gpu-memory-utilization 0.9",
    );
    // The spec's interface wins over the node default.
    expect(l.env.NCCL_SOCKET_IFNAME).toBe("=ib0");
    expect(l.env.VLLM_HOST_IP).toBe("10.0.0.6");
    expect([l.healthPath, l.metricsPath]).toEqual([null, null]);
  });

  it("data parallel 4 across two nodes: two ranks on each, meeting at rank 0's address and ports", () => {
    const r0 = vllmAdapter.build(twoNodeDataParallel(0), node);
    expect(r0.argv.join(" ")).toBe(
      "vllm serve meta-llama/Llama-3.1-70B-Instruct --host 10.0.0.5 --port 20010 --served-model-name llama-70b " +
        "--tensor-parallel-size 4 --pipeline-parallel-size 1 --data-parallel-size 4 --data-parallel-size-local 2 " +
        "--data-parallel-address 10.0.0.5 --data-parallel-rpc-port 20011 --gpu-memory-utilization 0.9",
    );
    expect([r0.env.VLLM_DP_MASTER_PORT, r0.env.VLLM_HOST_IP, r0.healthPath]).toEqual([
      "20012",
      "10.0.0.5",
      "/health",
    ]);
    // The whole replica's batch is served through rank 0's API.
    expect(r0.maxNumSeqs).toBe(4 * 256);

    const r1 = vllmAdapter.build(twoNodeDataParallel(1), { advertiseAddress: "10.0.0.6" });
    expect(r1.argv.join(" ")).toBe(
      "vllm serve meta-llama/Llama-3.1-70B-Instruct --host 10.0.0.6 --port 20020 --served-model-name llama-70b " +
        "--tensor-parallel-size 4 --pipeline-parallel-size 1 --data-parallel-size 4 --data-parallel-size-local 2 " +
        "--data-parallel-start-rank 2 --data-parallel-address 10.0.0.5 --data-parallel-rpc-port 20011 " +
        "--headless --gpu-memory-utilization 0.9",
    );
    expect(r1.argv).not.toContain("--master-port");
    expect([r1.env.VLLM_DP_MASTER_PORT, r1.env.VLLM_HOST_IP, r1.healthPath]).toEqual([
      "20012",
      "10.0.0.6",
      null,
    ]);
  });

  it("single node sets no socket interface (NCCL would refuse a missing one)", () => {
    const l = vllmAdapter.build(spec({ mgmtInterface: "eth9" }), node);
    expect(l.env.NCCL_SOCKET_IFNAME).toBeUndefined();
    expect(l.env.GLOO_SOCKET_IFNAME).toBeUndefined();
  });
});

describe("sglang adapter", () => {
  it("multi-node with --dist-init-addr", () => {
    const s = twoNodeSpec(0, "sglang");
    s.tensorParallel = 16;
    s.pipelineParallel = 1;
    const l = sglangAdapter.build(s, node);
    expect(l.argv.join(" ")).toBe(
      "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-405B-Instruct --host 10.0.0.5 --port 20010 " +
        "--tp 16 --nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.5:20011 --served-model-name llama-405b " +
        "--mem-fraction-static 0.9 --enable-metrics",
    );
    expect(l.env).toEqual({
      CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7",
      CUDA_DEVICE_ORDER: "PCI_BUS_ID",
      NCCL_SOCKET_IFNAME: "=ib0",
      GLOO_SOCKET_IFNAME: "ib0",
    });
    expect(l.metricNames.kvUsage).toBe("sglang:token_usage");

    const r1 = sglangAdapter.build(twoNodeSpec(1, "sglang"), {
      advertiseAddress: "10.0.0.6",
      bin: "/venv/bin/python",
    });
    expect(r1.argv[0]).toBe("/venv/bin/python");
    expect(r1.argv.join(" ")).toContain("--nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.5:20011");
    expect(r1.healthPath).toBeNull();
  });

  it("single node keeps dist-init inside the assigned ports, pp/dp when > 1, extra args last", () => {
    const l = sglangAdapter.build(
      spec({
        engine: "sglang",
        gpuIndices: [2, 3, 4, 5],
        tensorParallel: 2,
        pipelineParallel: 2,
        dataParallel: 1,
        args: ["--trust-remote-code"],
      }),
      node,
    );
    expect(l.argv.join(" ")).toBe(
      "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --host 10.0.0.5 --port 20000 " +
        "--tp 2 --pp-size 2 --dist-init-addr 10.0.0.5:20001 --served-model-name llama-8b " +
        "--mem-fraction-static 0.9 --enable-metrics --trust-remote-code",
    );
    expect(l.env.CUDA_VISIBLE_DEVICES).toBe("2,3,4,5");
  });
});

describe("sim adapter", () => {
  it("runs llmgw sim-engine serve on the agent's Node with vLLM's flags and no CUDA env", () => {
    const l = simAdapter.build(
      spec({ engine: "sim", gpuIndices: [], gpuMemoryUtilization: 0, env: { SIM_SPEED: "10" } }),
      {
        advertiseAddress: "127.0.0.1",
      },
    );
    expect(l.argv).toEqual([
      process.execPath,
      LLMGW_ENTRY,
      "sim-engine",
      "serve",
      "meta-llama/Llama-3.1-8B-Instruct",
      "--host",
      "127.0.0.1",
      "--port",
      "20000",
      "--served-model-name",
      "llama-8b",
      "--tensor-parallel-size",
      "1",
      "--pipeline-parallel-size",
      "1",
    ]);
    expect(LLMGW_ENTRY.endsWith("bin/llmgw.mjs")).toBe(true);
    expect(l.env).toEqual({ SIM_SPEED: "10" });
  });
});

describe("the batch an engine runs at once (its capacity at the edge)", () => {
  it("vLLM and the sim engine: --max-num-seqs in any spelling, else vLLM's default, times data parallel", () => {
    expect(vllmAdapter.build(spec(), node).maxNumSeqs).toBe(256);
    expect(vllmAdapter.build(spec({ args: ["--max-num-seqs", "64"] }), node).maxNumSeqs).toBe(64);
    expect(simAdapter.build(spec({ args: ["--max_num_seqs=4"] }), node).maxNumSeqs).toBe(4);
    expect(
      vllmAdapter.build(spec({ args: ["--max-num-seqs", "32"], dataParallel: 4 }), node).maxNumSeqs,
    ).toBe(128);
    // A malformed value is left to the engine to refuse; the edge assumes the default.
    expect(vllmAdapter.build(spec({ args: ["--max-num-seqs", "lots"] }), node).maxNumSeqs).toBe(256);
  });

  it("SGLang: an explicit --max-running-requests is known at launch, the rest from its server info", () => {
    const plain = sglangAdapter.build(spec({ engine: "sglang" }), node);
    expect(plain.maxNumSeqs).toBeUndefined();
    expect(plain.capacityProbe?.paths).toEqual(["/server_info", "/get_server_info"]);
    expect(
      sglangAdapter.build(spec({ engine: "sglang", args: ["--max-running-requests", "48"] }), node)
        .maxNumSeqs,
    ).toBe(48);
    // Each data-parallel rank's scheduler takes the whole figure, unless DP attention splits it.
    const dp = (args: string[]) =>
      sglangAdapter.build(spec({ engine: "sglang", dataParallel: 2, args }), node).maxNumSeqs;
    expect(dp(["--max-running-requests", "48"])).toBe(96);
    expect(dp(["--max-running-requests=48", "--enable-dp-attention"])).toBe(48);
    // Its health check generates a token: a bound that lets SGLang give its own verdict.
    expect(plain.healthTimeoutMs).toBe(25_000);
    expect(vllmAdapter.build(spec(), node).healthTimeoutMs).toBeUndefined();
    // A rank that serves no HTTP has no server info to ask.
    const follower = sglangAdapter.build(spec({ engine: "sglang", worldNodes: 2, rank: 1 }), node);
    expect(follower.capacityProbe).toBeNull();
    expect(vllmAdapter.build(spec(), node).capacityProbe).toBeNull();
  });
});

describe("an engine's key", () => {
  const key = "llmgw-e-abc";
  it("vLLM and the sim take it from VLLM_API_KEY, out of the command line and over a profile's env", () => {
    for (const adapter of [vllmAdapter, simAdapter]) {
      const launch = adapter.build(
        spec({ engine: adapter.engine, engineApiKey: key, env: { X: "1" } }),
        node,
      );
      expect(launch.env.VLLM_API_KEY).toBe(key);
      expect(launch.env.X).toBe("1");
      expect(launch.argv.join(" ")).not.toContain(key);
      expect(launch.apiKey).toBe(key);
    }
  });

  it("SGLang takes it as --api-key on the rank that serves HTTP only", () => {
    const head = sglangAdapter.build(spec({ engine: "sglang", engineApiKey: key }), node);
    expect(head.argv.slice(head.argv.indexOf("--api-key"), head.argv.indexOf("--api-key") + 2)).toEqual([
      "--api-key",
      key,
    ]);
    expect(head.apiKey).toBe(key);
    const follower = sglangAdapter.build(
      spec({ engine: "sglang", engineApiKey: key, worldNodes: 2, rank: 1 }),
      node,
    );
    expect(follower.argv).not.toContain("--api-key");
  });

  it("is none without one: no variable, no flag", () => {
    expect(vllmAdapter.build(spec(), node).env.VLLM_API_KEY).toBeUndefined();
    expect(sglangAdapter.build(spec({ engine: "sglang" }), node).argv).not.toContain("--api-key");
  });

  it("is blanked out of what the agent shows", () => {
    expect(redacted(`serve --api-key ${key} --port 1`, key)).toBe("serve --api-key [engine key] --port 1");
    expect(redacted("nothing to hide", "")).toBe("nothing to hide");
  });
});

describe("the flags each adapter sets", () => {
  it("are all refused in a profile's engine_args (common/engine-args.ts), so none can be undone there", () => {
    // Every option on: several nodes, data parallel, a memory share, both ranks.
    const layouts = [
      { worldNodes: 2, dataParallel: 2, tensorParallel: 2, pipelineParallel: 1, gpuMemoryUtilization: 0.8 },
      { worldNodes: 2, dataParallel: 1, tensorParallel: 4, pipelineParallel: 2, gpuMemoryUtilization: 0.8 },
    ].map((l) => ({ ...l, engineApiKey: "llmgw-e-key" }));
    for (const adapter of [vllmAdapter, simAdapter, sglangAdapter]) {
      for (const layout of layouts) {
        for (const rank of [0, 1]) {
          const launch = adapter.build(spec({ engine: adapter.engine, ...layout, rank }), node);
          const flags = launch.argv.filter((a) => a.startsWith("-") && a !== "-m");
          // Turning metrics on twice changes nothing.
          for (const f of flags.filter((f) => f !== "--enable-metrics"))
            expect(ownedArg(adapter.engine, f), `${adapter.engine} ${f}`).toBeDefined();
          // Every variable it sets is either refused in a profile's env or one the operator may retune.
          for (const name of Object.keys(launch.env))
            expect(ownedEnv({ [name]: "x" }).length === 1 || RETUNABLE_ENV.includes(name), name).toBe(true);
        }
      }
    }
  });
});
