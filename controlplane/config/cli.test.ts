import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { LLMGW, REPO } from "../../test/harness/process.ts";
import { checkConfig, configJsonSchema } from "./cli.ts";

const EXAMPLE = join(REPO, "infra", "examples", "llmgw.yaml");

function tmpFile(text: string): string {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-config-"));
  const file = join(dir, "llmgw.yaml");
  writeFileSync(file, text);
  return file;
}

describe("config check", () => {
  it("passes the example config and summarises it", () => {
    const r = checkConfig(EXAMPLE, { LLMGW_ROUTER__RETRIES: "3" });
    if (!r.ok) throw new Error(r.issues.join("\n"));
    expect(r.loaded.config.router.retries).toBe(3);
    const text = r.summary.join("\n");
    expect(text).toContain("environment overrides applied: router.retries");
    expect(text).toContain("tp8 × pp2 × dp1 = 16 GPUs (2 nodes × 8, fabric ib)");
    expect(text).toContain("replicas 3..6");
    expect(text).toContain("router-only: 2 static endpoint(s) (coder-a, coder-b)");
    expect(text).toContain("desired: 4 replica(s) on 19 GPU(s)");
    expect(r.catalog.get("llama-70b")?.profiles[0]?.gpusPerNode).toBe(8);
  });

  it("reports schema and catalog problems with paths", () => {
    const schemaBad = checkConfig(
      tmpFile("control:\n  interval: 5\nmodels:\n  - name: a\n    colour: red\n"),
      {},
    );
    expect(schemaBad.ok).toBe(false);
    if (!schemaBad.ok) {
      expect(schemaBad.issues).toContain("models[0].colour: unknown key");
      expect(schemaBad.issues.some((i) => i.startsWith("control.interval:"))).toBe(true);
    }
    const catalogBad = checkConfig(
      tmpFile(
        [
          "models:",
          "  - name: a",
          "    fallbacks: [b]",
          "  - name: b",
          "    fallbacks: [a]",
          "    profiles:",
          "      - {name: p, engine: vllm, source: x, tensor_parallel: 3, gpus_per_node: 2}",
        ].join("\n"),
      ),
      {},
    );
    expect(catalogBad.ok).toBe(false);
    if (!catalogBad.ok) {
      expect(catalogBad.issues).toEqual([
        "models[0].fallbacks: fallback cycle a → b → a",
        "models[1].profiles[0].gpus_per_node: gpus_per_node × nodes (2 × 1 = 2) must equal tensor_parallel × pipeline_parallel × data_parallel (3 × 1 × 1 = 3)",
      ]);
    }
  });

  it("exits 0 on the example and 1 with every error listed", () => {
    const ok = spawnSync(process.execPath, [LLMGW, "config", "check", EXAMPLE], { encoding: "utf8" });
    expect(ok.status).toBe(0);
    expect(ok.stdout).toContain("llmgw.yaml: OK");
    const bad = spawnSync(
      process.execPath,
      [LLMGW, "config", "check", tmpFile("models:\n  - name: a\n    aliases: [a]\n    fallbacks: [zz]\n")],
      { encoding: "utf8" },
    );
    expect(bad.status).toBe(1);
    expect(bad.stderr).toContain("2 problems");
    expect(bad.stderr).toContain('models[0].aliases[0]: "a" repeats the model\'s own name');
    expect(bad.stderr).toContain('models[0].fallbacks[0]: unknown model "zz"');
  });
});

describe("config schema", () => {
  it("describes the input side: durations as strings, defaults, descriptions", () => {
    const s = configJsonSchema() as {
      properties: Record<string, { properties?: Record<string, Record<string, unknown>> }>;
    };
    expect(s.properties.control?.properties?.interval).toEqual({ default: "5s", type: "string" });
    const models = s.properties.models as unknown as {
      items: {
        properties: Record<string, { items?: { properties: Record<string, { description?: string }> } }>;
      };
    };
    const profile = models.items.properties.profiles!.items!.properties;
    expect(profile.tensor_parallel?.description).toMatch(/divide the GPUs per node/);
    expect(s.properties.scaling?.properties?.scale_down_cooldown).toMatchObject({ default: "5m" });
    expect(s.properties.scaling?.properties?.target_saturation).toMatchObject({ default: 0.7 });
    expect(models.items.properties.priority).toMatchObject({ default: 0 });
    expect(models.items.properties.scaling).toBeDefined();
  });

  it("names the key of a bad scaling value, in the section and in a model's overrides", () => {
    const bad = checkConfig(
      tmpFile(
        [
          "scaling:",
          "  window: 1s",
          "  target_saturation: 1.5",
          "  colour: red",
          "models:",
          "  - name: a",
          "    priority: high",
          "    scaling: { tolerance: 0.6 }",
        ].join("\n"),
      ),
      {},
    );
    expect(bad.ok).toBe(false);
    if (!bad.ok)
      expect(bad.issues).toEqual(
        expect.arrayContaining([
          "scaling.window: must be between 2s and 1h",
          expect.stringMatching(/^scaling\.target_saturation: /),
          "scaling.colour: unknown key",
          expect.stringMatching(/^models\[0\]\.priority: /),
          expect.stringMatching(/^models\[0\]\.scaling\.tolerance: /),
        ]),
      );
    const band = checkConfig(
      tmpFile("models:\n  - name: a\n    scaling: { target_saturation: 0.1, tolerance: 0.2 }\n"),
      {},
    );
    expect(band.ok).toBe(false);
    if (!band.ok)
      expect(band.issues).toEqual([
        "models[0].scaling.tolerance: must be below target_saturation (0.1), or the model never scales down",
      ]);
  });
});
