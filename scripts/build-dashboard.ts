/**
 * Bundles the dashboard (dashboard/) with esbuild into one script, one
 * stylesheet and the page: no CDN, so it works offline. `npm start` and
 * `npm test` build it into dashboard/build/ first (prestart, vitest's
 * globalSetup), `npm run build` into dist/dashboard/build/ for the package;
 * the control plane serves it from there (controlplane/admin/dashboard.ts).
 */
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";

const repo = join(import.meta.dirname, "..");
export const CHECKOUT_DASHBOARD_BUILD = join(repo, "dashboard", "build");

export async function buildDashboard(outDir = CHECKOUT_DASHBOARD_BUILD): Promise<void> {
  mkdirSync(outDir, { recursive: true });
  await build({
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
  });
  copyFileSync(join(repo, "dashboard", "index.html"), join(outDir, "index.html"));
}

if (import.meta.main) {
  await buildDashboard(process.argv[2]);
  console.log(`built the dashboard in ${process.argv[2] ?? CHECKOUT_DASHBOARD_BUILD}`);
}
