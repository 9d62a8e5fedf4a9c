import { describe, expect, it } from "vitest";
import { buildCatalog, CatalogError, validateConfig } from "./catalog.ts";
import { configSchema } from "./config/schema.ts";

const cfg = (raw: Record<string, unknown>) => configSchema.parse(raw);
const prof = (over: Record<string, unknown> = {}) => ({
  name: "p",
  engine: "vllm",
  source: "org/m",
  ...over,
});

describe("names, aliases, fallbacks", () => {
  it("looks models up by name or alias and resolves fallbacks to names", () => {
    const c = buildCatalog(
      cfg({
        models: [
          { name: "big", aliases: ["gpt-4o"], fallbacks: ["small-alias"], profiles: [prof()] },
          { name: "small", aliases: ["small-alias"], routing: "round-robin" },
        ],
        endpoints: [{ id: "e1", url: "http://10.0.0.1:8000", models: ["small"] }],
      }),
    );
    expect(c.get("gpt-4o")?.name).toBe("big");
    expect(c.get("big")?.fallbacks).toEqual(["small"]);
    expect(c.get("big")?.routing).toBe("chat");
    expect(c.get("small")?.routing).toBe("round-robin");
    expect(c.get("small")?.routerOnly).toBe(true);
    expect(c.get("small")?.endpoints.map((e) => e.id)).toEqual(["e1"]);
    expect(c.profile("big/p")?.gpusPerReplica).toBe(1);
    expect(c.profile("gpt-4o", "p")?.key).toBe("big/p");
    expect(c.controlPlaneMode).toBe(true);
    expect(c.warnings).toEqual([]);
  });

  it("refuses an alias that is another model's name, and duplicates", () => {
    const issues = validateConfig(
      cfg({
        models: [{ name: "a", aliases: ["b", "x"] }, { name: "b", aliases: ["x"] }, { name: "a" }],
      }),
    );
    expect(issues).toEqual([
      'models[2].name: "a" is already the name of models[0]',
      'models[0].aliases[0]: "b" is already the name of models[1] (b)',
      'models[1].aliases[0]: "x" is already an alias of models[0] (a)',
    ]);
  });

  it("refuses unknown fallbacks and fallback cycles", () => {
    const issues = validateConfig(
      cfg({
        models: [
          { name: "a", fallbacks: ["b"] },
          { name: "b", aliases: ["bee"], fallbacks: ["c"] },
          { name: "c", fallbacks: ["bee", "nope"] },
          { name: "d", fallbacks: ["d"] },
        ],
      }),
    );
    expect(issues).toEqual([
      'models[2].fallbacks[1]: unknown model "nope"',
      'models[3].fallbacks[0]: "d" is this model itself',
      "models[1].fallbacks: fallback cycle b → c → b",
    ]);
  });

  it("refuses endpoints for unknown models and duplicate endpoint ids", () => {
    const issues = validateConfig(
      cfg({
        models: [{ name: "m" }],
        endpoints: [
          { id: "e", url: "http://h:1", models: ["m"] },
          { id: "e", url: "http://h:2", models: ["m", "zz"] },
        ],
      }),
    );
    expect(issues).toEqual([
      'endpoints[1].id: duplicate id "e" (also endpoints[0])',
      'endpoints[1].models[1]: unknown model "zz"',
    ]);
  });

  it("warns about a router-only model nothing serves", () => {
    const c = buildCatalog(cfg({ models: [{ name: "m" }] }));
    expect(c.warnings[0]).toMatch(/^models\[0\] \(m\): router-only/);
    expect(c.controlPlaneMode).toBe(false);
  });
});

describe("parallelism arithmetic", () => {
  const issuesOf = (...profiles: Record<string, unknown>[]) =>
    validateConfig(cfg({ models: [{ name: "x" }, { name: "m", profiles: profiles.map((p) => prof(p)) }] }));

  it("derives GPUs per node and per replica", () => {
    const c = buildCatalog(
      cfg({
        models: [
          {
            name: "m",
            profiles: [prof({ tensor_parallel: 8, pipeline_parallel: 2, nodes: 2, fabric: "ib" })],
          },
        ],
      }),
    );
    const p = c.profile("m/p")!;
    expect([p.gpusPerReplica, p.gpusPerNode, p.nodes, p.fabric]).toEqual([16, 8, 2, "ib"]);
    expect(p.replicas).toEqual({ min: 1, max: 1 });
    // Make before break unless told otherwise.
    expect(p.rollout).toEqual({ maxSurge: 1, maxUnavailable: 0, paused: false });
  });

  it("reports every arithmetic error with its exact path, all at once", () => {
    const issues = issuesOf(
      { name: "a", tensor_parallel: 3, nodes: 2, fabric: "ib" },
      { name: "b", tensor_parallel: 8, gpus_per_node: 4 },
      { name: "c", tensor_parallel: 8, pipeline_parallel: 2, nodes: 4, fabric: "ib" },
      { name: "d", tensor_parallel: 8, pipeline_parallel: 2, nodes: 2 },
      { name: "e", replicas: { min: 3, max: 2 } },
      { name: "f", tensor_parallel: 2, pipeline_parallel: 2, data_parallel: 2, nodes: 2, fabric: "ib" },
      { name: "g", tensor_parallel: 4, pipeline_parallel: 2, data_parallel: 2, nodes: 4, fabric: "ib" },
      { name: "h", rollout: { max_surge: 0, max_unavailable: 0 } },
    );
    expect(issues).toEqual([
      "models[1].profiles[0].nodes: must divide tensor_parallel × pipeline_parallel × data_parallel (3 × 1 × 1 = 3)",
      "models[1].profiles[1].gpus_per_node: gpus_per_node × nodes (4 × 1 = 4) must equal tensor_parallel × pipeline_parallel × data_parallel (8 × 1 × 1 = 8)",
      "models[1].profiles[2].tensor_parallel: must divide the GPUs per node (4)",
      'models[1].profiles[3].fabric: a profile spanning 2 nodes must name a fabric label key (e.g. "ib") its nodes share',
      "models[1].profiles[4].replicas.max: must be at least replicas.min (3)",
      "models[1].profiles[6].data_parallel: with several nodes each data-parallel rank must fit on one node (tensor_parallel × pipeline_parallel = 8, GPUs per node 4)",
      "models[1].profiles[7].rollout: max_surge and max_unavailable cannot both be 0: a changed profile could never replace a replica",
    ]);
  });

  it("refuses engine_args that repeat what llmgw sets itself, each with its path and where it comes from", () => {
    const issues = validateConfig(
      cfg({
        models: [
          {
            name: "m",
            profiles: [
              prof({
                engine_args: [
                  "--max-model-len",
                  "4096",
                  "--port=9000",
                  "-tp",
                  "2",
                  "--gpu_memory_utilization",
                  "0.5",
                ],
              }),
              prof({
                name: "s",
                engine: "sglang",
                engine_args: ["--api-key", "k", "--max-running-requests", "64", "--tp-size", "2"],
              }),
            ],
          },
        ],
      }),
    );
    expect(issues).toEqual([
      "models[0].profiles[0].engine_args[2]: --port is set by llmgw: placement assigns each replica its address and ports; remove it",
      "models[0].profiles[0].engine_args[3]: -tp is set by llmgw: set the profile's tensor_parallel; remove it",
      "models[0].profiles[0].engine_args[5]: --gpu-memory-utilization is set by llmgw: set the profile's gpu_memory_utilization, which placement counts; remove it",
      "models[0].profiles[1].engine_args[0]: --api-key is set by llmgw: the control plane gives each replica's engine a key of its own and the edge sends it (docs/security.md, engine keys); another would refuse the edge; remove it",
      "models[0].profiles[1].engine_args[4]: --tp-size is set by llmgw: set the profile's tensor_parallel; remove it",
    ]);
  });

  it("refuses env that undoes the GPUs and ports placement assigned, and keeps the rest", () => {
    const issues = validateConfig(
      cfg({
        models: [
          {
            name: "m",
            profiles: [
              prof({ env: { CUDA_VISIBLE_DEVICES: "0", NCCL_SOCKET_IFNAME: "=ib0", HF_HOME: "/data" } }),
            ],
          },
        ],
      }),
    );
    expect(issues).toEqual([
      "models[0].profiles[0].env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by llmgw: placement assigns each shard its GPUs; remove it",
    ]);
  });

  it("lets SGLang's total tensor parallel cover whole nodes", () => {
    expect(issuesOf({ engine: "sglang", tensor_parallel: 16, nodes: 2, fabric: "ib" })).toEqual([]);
    expect(issuesOf({ engine: "vllm", tensor_parallel: 16, nodes: 2, fabric: "ib" })).toEqual([
      "models[1].profiles[0].tensor_parallel: must divide the GPUs per node (8)",
    ]);
  });

  it("refuses duplicate profile names", () => {
    expect(issuesOf({ name: "a" }, { name: "a" })).toEqual([
      'models[1].profiles[1].name: "a" is already used by profiles[0]',
    ]);
  });

  it("throws a CatalogError carrying the issues", () => {
    expect(() => buildCatalog(cfg({ models: [{ name: "a", fallbacks: ["z"] }] }))).toThrow(CatalogError);
  });
});
