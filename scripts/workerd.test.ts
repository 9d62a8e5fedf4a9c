import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { REPO } from "../common/processes.ts";
import { bundleIsCurrent, varsIn, varsOf } from "./workerd.ts";

describe("varsOf: a wrangler.toml's [vars], as wrangler dev binds them", () => {
  it("reads the edge's wrangler.toml", () => {
    expect(varsOf(join(REPO, "wrangler.toml"))).toEqual({
      LLMGW_ROUTER: "{}",
      LLMGW_POOL_LOCATION: "",
      LLMGW_VPC_BINDING: "ONPREM",
    });
  });

  it("reads basic strings with escapes and literal strings, skips comments, and stops at the next table", () => {
    const toml = [
      'name = "x"',
      "[vars]",
      "# a comment",
      'A = "{\\"retries\\":2}"   # trailing comment',
      "B = 'C:\\path'",
      "",
      "[[kv_namespaces]]",
      'binding = "KV"',
    ].join("\n");
    expect(varsIn(toml, "t.toml")).toEqual({ A: '{"retries":2}', B: "C:\\path" });
  });

  it("has none without a [vars] table", () => {
    expect(varsIn('name = "x"\n', "t.toml")).toEqual({});
  });

  it("refuses what it cannot read rather than leave a var unbound", () => {
    expect(() => varsIn("[vars]\nN = 1\n", "t.toml")).toThrow('t.toml: [vars]: cannot read "N = 1"');
  });
});

describe("bundleIsCurrent: a bundle newer than all it was built from is kept", () => {
  const root = mkdtempSync(join(tmpdir(), "llmgw-bundle-current-"));
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const at = (file: string, seconds: number) => utimesSync(file, seconds, seconds);

  /** A config, a lockfile, two sources and a bundle built at t=100 whose map lists the sources. */
  function layout(name: string) {
    const dir = join(root, name);
    const out = join(dir, "out");
    mkdirSync(join(dir, "src"), { recursive: true });
    mkdirSync(out);
    const files = {
      config: join(dir, "wrangler.toml"),
      lock: join(dir, "package-lock.json"),
      a: join(dir, "src", "a.ts"),
      b: join(dir, "src", "b.ts"),
      script: join(out, "worker.js"),
    };
    for (const f of [files.config, files.lock, files.a, files.b, files.script]) writeFileSync(f, "x");
    writeFileSync(
      `${files.script}.map`,
      JSON.stringify({ version: 3, sources: ["../src/a.ts", "../src/b.ts"] }),
    );
    for (const f of [files.config, files.lock, files.a, files.b]) at(f, 50);
    at(files.script, 100);
    const current = () => bundleIsCurrent(files.config, out, "worker.js", files.lock);
    return { files, current };
  }

  it("keeps a bundle when nothing changed since it was built", () => {
    expect(layout("same").current()).toBe(true);
  });

  it("rebuilds when a source, the config or the lockfile is newer than the bundle", () => {
    for (const which of ["a", "config", "lock"] as const) {
      const l = layout(`newer-${which}`);
      at(l.files[which], 150);
      expect(l.current(), which).toBe(false);
    }
  });

  it("rebuilds when a source is gone, or there is no bundle or no map", () => {
    const gone = layout("gone");
    rmSync(gone.files.b);
    expect(gone.current()).toBe(false);
    const noMap = layout("no-map");
    rmSync(`${noMap.files.script}.map`);
    expect(noMap.current()).toBe(false);
    const none = layout("none");
    rmSync(none.files.script);
    expect(none.current()).toBe(false);
  });
});
