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
    expect(text).toContain("streams committed at the engine's headers, web pages from any origin");
    expect(r.catalog.get("llama-70b")?.profiles[0]?.gpusPerNode).toBe(8);
  });

  it("says when streams are committed and which web pages may call, and names the key of a value it does not know", () => {
    const held = checkConfig(EXAMPLE, { LLMGW_ROUTER__STREAM_COMMIT: "first_token" });
    if (!held.ok) throw new Error(held.issues.join("\n"));
    expect(held.summary.join("\n")).toContain("streams committed at the first token");
    const pages = checkConfig(EXAMPLE, { LLMGW_ROUTER__CORS__ALLOWED_ORIGINS: "[https://chat.example.com]" });
    if (!pages.ok) throw new Error(pages.issues.join("\n"));
    expect(pages.summary.join("\n")).toContain("web pages from https://chat.example.com");
    const path = checkConfig(EXAMPLE, {
      LLMGW_ROUTER__CORS__ALLOWED_ORIGINS: "[https://chat.example.com/app]",
    });
    expect(path.ok).toBe(false);
    if (!path.ok)
      expect(path.issues.join("\n")).toMatch(/router\.cors\.allowed_origins\[0\]: must be "\*" or an origin/);
    const bad = checkConfig(EXAMPLE, { LLMGW_ROUTER__STREAM_COMMIT: "body" });
    expect(bad.ok).toBe(false);
    if (!bad.ok) expect(bad.issues.join("\n")).toMatch(/router\.stream_commit/);
  });

  it("refuses router.timeouts.dial with why, and accepts a served_model_name per endpoint", () => {
    const dial = checkConfig(tmpFile("router:\n  timeouts: { dial: 3s }\nmodels:\n  - name: hand\n"), {});
    expect(dial.ok).toBe(false);
    if (!dial.ok) {
      expect(dial.issues).toEqual([
        expect.stringMatching(
          /^router\.timeouts\.dial: not supported: Workers' fetch cannot bound connecting/,
        ),
      ]);
    }
    const r = checkConfig(
      tmpFile(
        [
          "models:",
          "  - name: hand",
          "endpoints:",
          "  - id: hand-1",
          "    url: http://127.0.0.1:9",
          "    models: [hand]",
          "    served_model_name: org/hand-engine",
        ].join("\n"),
      ),
      {},
    );
    if (!r.ok) throw new Error(r.issues.join("\n"));
    expect(r.loaded.config.endpoints[0]!.served_model_name).toBe("org/hand-engine");
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

  it("reports catalog problems beside the schema's, as docs/configuration.md shows", () => {
    const mixed = checkConfig(
      tmpFile(
        [
          "control:",
          "  port_range: [21000, 20000]",
          "models:",
          "  - {name: a, profiles: [{name: p, engine: vllm, source: x/a}]}",
          "  - {name: llama, profiles: [{name: p, engine: vllm, source: x/l}]}",
          "  - name: c",
          "    profiles: [{name: tp8, engine: vllm, source: x/c, tensor_parallel: 8, nodes: 2, gpus_per_node: 4, fabric: ib}]",
          "  - {name: d, aliases: [llama], profiles: [{name: p, engine: vllm, source: x/d}]}",
        ].join("\n"),
      ),
      {},
    );
    expect(mixed.ok).toBe(false);
    if (!mixed.ok)
      expect(mixed.issues).toEqual([
        "control.port_range: first port must not exceed the last",
        'models[3].aliases[0]: "llama" is already the name of models[1] (llama)',
        "models[2].profiles[0].tensor_parallel: must divide the GPUs per node (4)",
      ]);
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
