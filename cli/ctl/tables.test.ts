import { describe, expect, it } from "vitest";
import { replicaToProto } from "../../controlplane/admin/replicas.ts";
import type { ReplicaRecord } from "../../controlplane/reconcile/types.ts";
import { type NodeJson, nodesTable } from "./nodes.ts";
import { failureNote, replicaJson } from "./replicas.ts";

const T = Date.parse("2026-01-01T12:00:00Z");

describe("ctl replicas", () => {
  it("dates a failure, and tells a planned restart whose time has passed as past", () => {
    const f = {
      reason: "killed by SIGKILL (exit code 137); restart 1 in 10s",
      exitCode: 137,
      outputTail: [],
      at: new Date(T).toISOString(),
    };
    expect(failureNote(f, T + 4_000)).toBe(
      "killed by SIGKILL (exit code 137); restart 1 in 10s (exit 137), 4s ago",
    );
    expect(failureNote(f, T + 300_000)).toBe(
      "killed by SIGKILL (exit code 137); restart 1 was due 10s after (exit 137), 5m ago",
    );
  });

  it("dates a stopping replica by its stop, not by its placement", () => {
    const r: ReplicaRecord = {
      id: "m/p/0",
      model: "m",
      profile: "p",
      index: 0,
      generation: 1,
      shards: [],
      worldNodes: 1,
      retiring: [
        { rank: 0, node: "a", gpus: [0], ports: { http: 1, distInit: [] }, state: "stopping", since: T },
      ],
      retire: true,
      origin: "placed",
      adopted: true,
      restarts: 0,
      placedAt: T - 3_600_000,
    };
    const json = replicaJson(replicaToProto(r, T + 5_000, undefined, () => ({})));
    expect(json).toMatchObject({ state: "stopping", since: new Date(T).toISOString() });
  });
});

describe("ctl nodes", () => {
  const node = (over: Partial<NodeJson>): NodeJson => ({
    name: "gpu-1",
    state: "ready",
    since: new Date(T - 60_000).toISOString(),
    lastSeen: new Date(T - 1_000).toISOString(),
    registeredAt: new Date(T - 60_000).toISOString(),
    connected: true,
    revoked: false,
    revokedAt: "",
    cordoned: false,
    draining: false,
    drainDeadline: "",
    awaitingReconnect: false,
    lastRefusedClaim: null,
    agentVersion: "0.1.0",
    agentInstance: "i",
    advertiseAddress: "10.0.0.1",
    fabric: {},
    simulated: true,
    cpuCores: 8,
    ramTotalMiB: 1024,
    gpus: [],
    ...over,
  });

  it("shows a drain's deadline, and a node awaited after a restart", () => {
    const out = nodesTable(
      [
        node({ cordoned: true, draining: true, drainDeadline: new Date(T + 480_000).toISOString() }),
        node({
          name: "gpu-2",
          state: "unreachable",
          connected: false,
          awaitingReconnect: true,
          lastSeen: "",
          registeredAt: "",
        }),
      ],
      T,
    );
    expect(out).toMatch(/^gpu-1 \(draining, deadline in 8m\)\s+ready\s/m);
    expect(out).toMatch(/^gpu-2\s+awaiting reconnect\s+.*\s-$/m);
  });
});
