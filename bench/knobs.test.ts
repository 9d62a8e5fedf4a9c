import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO } from "../common/processes.ts";

/** A bench started with `env` laid over this one's: its exit code and what it said. */
function start(bench: string, env: Record<string, string>) {
  const r = spawnSync(process.execPath, ["--import", "tsx", join(REPO, "bench", bench)], {
    env: { ...process.env, ...env },
    encoding: "utf8",
    timeout: 30_000,
  });
  return { code: r.status, stderr: r.stderr };
}

describe("a benchmark's settings", () => {
  it("stop the run before it starts when one is no number, naming it", () => {
    expect(start("startup.ts", { ROUNDS: "4x" })).toEqual({
      code: 2,
      stderr: 'bench: ROUNDS: "4x" is not a number of at least 1\n',
    });
    expect(start("agents.ts", { OUTAGES: "0,ten" }).stderr).toBe(
      'bench: OUTAGES: "ten" in "0,ten" is not a number of at least 0\n',
    );
    expect(start("scaling.ts", { SCALING: "[1]" }).stderr).toBe(
      'bench: SCALING: "[1]" is not a JSON object\n',
    );
  });
});
