import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { cycles, importsOf, repoSources, violations } from "./import-graph.ts";

const REPO = join(import.meta.dirname, "..");

describe("the repository's imports (README, Layout)", () => {
  const sources = repoSources(REPO);

  it("reads the tree, generated code left out", () => {
    expect(sources.has("agent/supervisor.ts")).toBe(true);
    expect(sources.has("scripts/import-graph.ts")).toBe(true);
    expect(sources.has("dashboard/main.tsx")).toBe(true);
    expect([...sources.keys()].filter((f) => f.startsWith("proto/gen/"))).toEqual([]);
  });

  it("nothing in agent/ or edge/ imports controlplane/; agent/ and controlplane/ share only common/; sim-engine/ imports only common/; dashboard/ only common/ and proto/, and no program imports it; no program imports test/; loadgen/ not controlplane/; cli/ctl/ not controlplane/ or agent/, and only scripts/ and tests import cli/", () => {
    expect(violations(sources)).toEqual([]);
  });

  it("no circle of imports", () => {
    expect(cycles(sources)).toEqual([]);
  });
});

describe("the checker", () => {
  it("sees static, type-only, re-exported, side-effect and dynamic imports; not packages", () => {
    const text = [
      'import { a } from "./a.ts";',
      'import type { B } from "../b/b.ts";',
      'export { c } from "./c.ts";',
      'import "./d.ts";',
      'const e = await import("../e.ts");',
      'import { z } from "zod";',
      "import {\n  f,\n  g,\n} from './fg.ts';",
    ].join("\n");
    expect(importsOf("x/y/file.ts", text).sort()).toEqual(
      ["x/b/b.ts", "x/e.ts", "x/y/a.ts", "x/y/c.ts", "x/y/d.ts", "x/y/fg.ts"].sort(),
    );
  });

  it("finds a forbidden import and a circle", () => {
    const files = new Map([
      ["agent/a.ts", 'import { b } from "../controlplane/b.ts";'],
      ["controlplane/b.ts", 'import type { c } from "./c.ts";'],
      ["controlplane/c.ts", 'import { b } from "./b.ts";'],
      ["edge/ok.ts", 'import { x } from "../common/x.ts";'],
      ["dashboard/ok.tsx", 'import { S } from "../proto/gen/s_pb.ts";\nimport { y } from "../common/y.ts";'],
      ["dashboard/bad.tsx", 'import { r } from "../controlplane/r.ts";'],
      ["controlplane/d.ts", 'import { p } from "../dashboard/p.tsx";'],
    ]);
    expect(violations(files)).toEqual([
      { file: "agent/a.ts", imports: "controlplane/b.ts", rule: "agent/ must not import controlplane/" },
      {
        file: "dashboard/bad.tsx",
        imports: "controlplane/r.ts",
        rule: "dashboard/ must not import controlplane/",
      },
      {
        file: "controlplane/d.ts",
        imports: "dashboard/p.tsx",
        rule: "controlplane/ must not import dashboard/",
      },
    ]);
    expect(cycles(files)).toEqual([["controlplane/b.ts", "controlplane/c.ts", "controlplane/b.ts"]]);
  });

  it("keeps ctl a client: it may not import the control plane, its unit tests may; nothing below cli/ imports it", () => {
    const files = new Map([
      ["cli/ctl/nodes.ts", 'import { Registry } from "../../controlplane/registry.ts";'],
      ["cli/ctl/tables.test.ts", 'import { replicaToProto } from "../../controlplane/admin/replicas.ts";'],
      ["cli/llmgw.ts", 'const m = await import("../controlplane/server-main.ts");'],
      ["controlplane/server.ts", 'import { controlClient } from "../cli/ctl/client.ts";'],
      ["scripts/fleet.ts", 'import { controlClient } from "../cli/ctl/client.ts";'],
    ]);
    expect(violations(files)).toEqual([
      {
        file: "cli/ctl/nodes.ts",
        imports: "controlplane/registry.ts",
        rule: "cli/ctl/ must not import controlplane/",
      },
      {
        file: "controlplane/server.ts",
        imports: "cli/ctl/client.ts",
        rule: "controlplane/ must not import cli/",
      },
    ]);
  });

  it("keeps test/ to tests: a program's code may not import it, its unit tests may", () => {
    const files = new Map([
      ["scripts/local-stack.ts", 'import { killEngines } from "../test/harness/engines.ts";'],
      ["controlplane/reconcile/plan.test.ts", 'import { gpuNode } from "../../test/fixtures/placement.ts";'],
      ["loadgen/stats.ts", 'import { renderTable } from "../controlplane/table.ts";'],
      ["test/x.test.ts", 'import { REPO } from "./harness/process.ts";'],
    ]);
    expect(violations(files)).toEqual([
      {
        file: "scripts/local-stack.ts",
        imports: "test/harness/engines.ts",
        rule: "scripts/ must not import test/",
      },
      {
        file: "loadgen/stats.ts",
        imports: "controlplane/table.ts",
        rule: "loadgen/ must not import controlplane/",
      },
    ]);
  });

  it("keeps the edge's router core pure and EdgeSync a way in: routing/ imports only config/ of the edge's folders; only app.ts imports sync/", () => {
    const files = new Map([
      ["edge/routing/pool-core.ts", 'import type { RouterConfig } from "../config/router.ts";'],
      ["edge/routing/picker.ts", 'import { poolOf } from "../pool/client.ts";'],
      ["edge/app.ts", 'import { edgeSync } from "./sync/service.ts";'],
      ["edge/proxy/proxy.ts", 'import { putEndpoints } from "../sync/config.ts";'],
    ]);
    expect(violations(files)).toEqual([
      {
        file: "edge/routing/picker.ts",
        imports: "edge/pool/client.ts",
        rule: "edge/routing/ must not import edge/pool/",
      },
      {
        file: "edge/proxy/proxy.ts",
        imports: "edge/sync/config.ts",
        rule: "edge/proxy/ must not import edge/sync/",
      },
    ]);
  });
});
