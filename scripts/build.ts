/**
 * `npm run build` (and `npm pack`, through prepack): compiles the Node side
 * to JavaScript in dist/, so an installed package runs on plain Node with no
 * tsx, TypeScript or other dev tooling. A checkout never needs this:
 * bin/llmgw.mjs runs the sources through tsx when they are there.
 *
 * tsc starts from cli/llmgw.ts and follows every import, the subcommands'
 * dynamic ones included, so dist/ holds exactly what `llmgw` can load — no
 * tests, benches or Worker-only modules — with `.ts` specifiers rewritten to
 * `.js`. Types are checked by `npm run check`, not here (noCheck).
 *
 * Why compile rather than let Node strip the types: Node refuses to strip
 * types in files under node_modules, where an installed package lives, and
 * its strip-only mode cannot run enums (proto/gen) or parameter properties.
 */
import { execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildDashboard } from "./build-dashboard.ts";

const repo = join(import.meta.dirname, "..");
const dist = join(repo, "dist");

rmSync(dist, { recursive: true, force: true });
execFileSync(join(repo, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.build.json"], {
  cwd: repo,
  stdio: "inherit",
});

// The sim engine adapter runs `<node> ../../bin/llmgw.mjs` relative to its
// own module (agent/engines/sim.ts), which in the compiled tree is
// dist/bin/llmgw.mjs: the compiled tree's own entry.
mkdirSync(join(dist, "bin"));
const entry = join(dist, "bin", "llmgw.mjs");
writeFileSync(
  entry,
  '#!/usr/bin/env node\n// Written by scripts/build.ts: the entry of the compiled tree.\nimport "../cli/llmgw.js";\n',
);
chmodSync(entry, 0o755);

// The dashboard's bundle, where controlplane/admin/dashboard.ts looks for it
// in the compiled tree.
await buildDashboard(join(dist, "dashboard", "build"));
console.log(`built ${dist}`);
