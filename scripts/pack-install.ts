import { execFile } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { REPO } from "../common/processes.ts";

const run = promisify(execFile);

export interface Installed {
  /** The tarball `npm pack` made, and the paths it holds. */
  tarball: string;
  files: string[];
  /** The project it was installed into (its node_modules holds llmgw). */
  app: string;
  /** The installed package, node_modules/llmgw. */
  root: string;
  /** Its entry point, what `node_modules/.bin/llmgw` links to. */
  bin: string;
}

/**
 * `npm pack` in this checkout (prepack compiles dist/), then the tarball
 * installed as an operator installs it: into an empty project outside the
 * checkout, with `--omit=dev`. Nothing of the checkout is reachable from
 * there but the Node binary the caller runs it with.
 */
export async function packAndInstall(dir: string): Promise<Installed> {
  const { stdout } = await run("npm", ["pack", "--json", "--pack-destination", dir], {
    cwd: REPO,
    maxBuffer: 16 * 1024 * 1024,
  });
  // prepack's own output comes first; the JSON report is the rest.
  const report = stdout.slice(stdout.search(/^\[/m));
  const [packed] = JSON.parse(report) as { filename: string; files: { path: string }[] }[];
  if (!packed) throw new Error(`npm pack printed no tarball: ${stdout}`);
  const tarball = join(dir, packed.filename);
  const app = join(dir, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), '{ "name": "llmgw-install", "private": true }\n');
  await run(
    "npm",
    ["install", tarball, "--omit=dev", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"],
    { cwd: app, maxBuffer: 16 * 1024 * 1024 },
  );
  const root = join(app, "node_modules", "llmgw");
  const files = packed.files.map((f) => f.path);
  return { tarball, files, app, root, bin: join(root, "bin", "llmgw.mjs") };
}
