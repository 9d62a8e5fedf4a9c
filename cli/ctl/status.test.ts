import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { GetEdgeStatusResponseSchema } from "../../proto/gen/control/v1/control_pb.ts";
import { formatStatus, statusJson, unplaced } from "./status.ts";

describe("unplaced", () => {
  it("keeps the explain blocks of replicas that are not placed, detail lines and all", () => {
    const lines = [
      "m/tp8/0 placed: rank 0 on a1 GPU 0-7 port 23001",
      "  why: bin-pack (score 1.00)",
      "m/tp8/1: 0/3 nodes can host m/tp8: 2 lost",
      "  needs: 8 GPUs",
      "  lost: a1, a2",
      "m/tp8/2: in backoff until 12:00",
      "  0/3 nodes can host m/tp8",
    ];
    expect(unplaced(lines)).toEqual(lines.slice(2));
    expect(unplaced(lines.slice(0, 2))).toEqual([]);
  });

  it("leaves out the scaling block, which is about the model", () => {
    const lines = [
      "scaling: 2 replica(s) wanted, 1 ready (min 1, max 3; target saturation 0.70 ± 0.10)",
      "  why: holding 2: demand 1.10 puts them at 0.55, within 0.60..0.80",
      "  last decision: none since the control plane started",
      "m/1gpu/0 placed: rank 0 on a1 GPU 0 port 23001",
      "m/1gpu/1: 0/1 nodes can host m/1gpu: 1 has fewer than 1 free GPU",
    ];
    expect(unplaced(lines)).toEqual(lines.slice(4));
  });
});

describe("formatStatus", () => {
  const empty = { nodes: [], replicas: [], models: [] };

  it("says when the control plane has no edge to poll", () => {
    const out = formatStatus({ ...empty, edge: create(GetEdgeStatusResponseSchema, { configured: false }) });
    expect(out).toContain("EDGE not polled: the control plane has no edge.url or no EdgeSync secret");
    expect(out).toContain("no nodes have registered");
  });

  it("says when the last poll failed, and how old the pools shown are", () => {
    const edge = create(GetEdgeStatusResponseSchema, {
      configured: true,
      edgeUrl: "https://llm.example.com",
      pollIntervalMs: 5_000,
      lastSuccessAtUnixMs: 40_000n,
      lastError: "[unavailable] connect ECONNREFUSED",
      lastErrorAtUnixMs: 58_000n,
    });
    expect(formatStatus({ ...empty, edge }, 60_000)).toContain(
      "EDGE https://llm.example.com: polled 20s ago, every 5s; last poll failed 2s ago: [unavailable] connect ECONNREFUSED",
    );
  });
});

describe("ctl status's sites", () => {
  const empty = { nodes: [], replicas: [], models: [] };
  const pool = (sites: { site: string; routed: bigint; routedLastMinute: bigint; loadFeed: string }[]) =>
    create(GetEdgeStatusResponseSchema, {
      configured: true,
      edgeUrl: "https://llm.example.com",
      pollIntervalMs: 2_000,
      lastSuccessAtUnixMs: 59_000n,
      models: [
        {
          model: "m",
          pool: {
            model: "m",
            loadFeed: "live",
            sites: sites.map((s, i) => ({ ...s, version: BigInt(3 + i), endpoints: 2 })),
            endpoints: sites.flatMap((s) => [
              { id: `m/1gpu/0@${s.site}`, site: s.site, state: "ready" },
              { id: `m/1gpu/1@${s.site}`, site: s.site, state: s.loadFeed === "live" ? "ready" : "draining" },
            ]),
          },
        },
      ],
    });

  it("prints each site's health and share of the model's traffic in the last minute, and --json carries them", () => {
    // Site B was the busier one since the pool started; in the last minute, site A is.
    const edge = pool([
      { site: "site-a", routed: 30n, routedLastMinute: 9n, loadFeed: "live" },
      { site: "site-b", routed: 50n, routedLastMinute: 3n, loadFeed: "stale" },
    ]);
    const out = formatStatus({ ...empty, edge }, 60_000);
    expect(out).toContain(
      [
        "SITES (each model's pool at the edge)",
        "model  site    endpoint set  endpoints  ready  load feed  routed  last minute  share",
        "m      site-a  v3            2          2      live       30      9            75%",
        "m      site-b  v4            2          1      stale      50      3            25%",
      ].join("\n"),
    );
    expect(out).toContain(
      "  routed to: site-a 30 (9 in the last minute, 75%), site-b 50 (3 in the last minute, 25%)",
    );
    expect(statusJson({ ...empty, edge }).sites).toEqual([
      {
        model: "m",
        site: "site-a",
        version: 3,
        endpoints: 2,
        ready: 2,
        loadFeed: "live",
        routed: 30,
        routedLastMinute: 9,
        share: 0.75,
      },
      {
        model: "m",
        site: "site-b",
        version: 4,
        endpoints: 2,
        ready: 1,
        loadFeed: "stale",
        routed: 50,
        routedLastMinute: 3,
        share: 0.25,
      },
    ]);
  });

  it("has no share without a request in the last minute, and no SITES table for an edge of one site", () => {
    const quiet = pool([
      { site: "site-a", routed: 7n, routedLastMinute: 0n, loadFeed: "live" },
      { site: "site-b", routed: 0n, routedLastMinute: 0n, loadFeed: "live" },
    ]);
    expect(formatStatus({ ...empty, edge: quiet }, 60_000)).toContain(
      "m      site-a  v3            2          2      live       7       0            -",
    );
    const single = pool([{ site: "default", routed: 5n, routedLastMinute: 5n, loadFeed: "live" }]);
    expect(formatStatus({ ...empty, edge: single }, 60_000)).not.toContain("SITES");
    expect(statusJson({ ...empty, edge: single }).sites).toEqual([]);
  });
});
