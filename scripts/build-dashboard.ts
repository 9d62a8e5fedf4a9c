/**
 * Bundles the dashboard (dashboard/) with esbuild into one script, one
 * stylesheet and the page: no CDN, so it works offline. `npm start` and
 * `npm test` build it into dashboard/build/ first (prestart, vitest's
 * globalSetup), `npm run build` into dist/dashboard/build/ for the package;
 * the control plane serves it from there (controlplane/admin/dashboard.ts).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";
import { writeFileAtomic } from "../common/atomic-write.ts";

const repo = join(import.meta.dirname, "..");
export const CHECKOUT_DASHBOARD_BUILD = join(repo, "dashboard", "build");

/**
 * Each file is replaced whole (written beside, then renamed): a control
 * plane serving the page while `npm start` or a test run rebuilds it never
 * sends half a script.
 */
export async function buildDashboard(outDir = CHECKOUT_DASHBOARD_BUILD): Promise<void> {
  const { outputFiles } = await build({
    entryPoints: { app: join(repo, "dashboard", "main.tsx") },
    outdir: outDir,
    bundle: true,
    format: "esm",
    target: "es2022",
    platform: "browser",
    minify: true,
    sourcemap: false,
    jsx: "automatic",
    jsxImportSource: "preact",
    tsconfig: join(repo, "dashboard", "tsconfig.json"),
    logLevel: "warning",
    write: false,
  });
  for (const f of outputFiles) writeFileAtomic(f.path, f.text);
  writeFileAtomic(join(outDir, "index.html"), readFileSync(join(repo, "dashboard", "index.html"), "utf8"));
}

if (import.meta.main) {
  await buildDashboard(process.argv[2]);
  console.log(`built the dashboard in ${process.argv[2] ?? CHECKOUT_DASHBOARD_BUILD}`);
}
