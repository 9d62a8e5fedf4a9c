/**
 * CI proof that the committed proto/gen matches the .proto files: generate
 * into a scratch directory and compare byte for byte.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

const repo = join(import.meta.dirname, "..");
const scratch = mkdtempSync(join(tmpdir(), "llmgw-proto-"));

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

try {
  execFileSync(join(repo, "node_modules", ".bin", "buf"), ["generate", "-o", scratch], {
    cwd: repo,
    stdio: "inherit",
  });
  const fresh = join(scratch, "proto", "gen");
  const committed = join(repo, "proto", "gen");
  const a = files(fresh)
    .map((f) => relative(fresh, f))
    .sort();
  const b = files(committed)
    .map((f) => relative(committed, f))
    .sort();
  const stale: string[] = [];
  for (const f of new Set([...a, ...b])) {
    const x = a.includes(f) ? readFileSync(join(fresh, f), "utf8") : undefined;
    const y = b.includes(f) ? readFileSync(join(committed, f), "utf8") : undefined;
    if (x !== y) stale.push(f);
  }
  if (stale.length > 0) {
    console.error(`proto/gen is stale (run \`npm run proto:gen\` and commit): ${stale.join(", ")}`);
    process.exit(1);
  }
  console.log(`proto/gen is current (${a.length} files)`);
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
