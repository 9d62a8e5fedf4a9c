import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { LLMGW } from "../test/harness/process.ts";
import { createLogger, logLevelProblem } from "./log.ts";

describe("LLMGW_LOG_LEVEL", () => {
  it("accepts the four levels and unset, and names what else it got", () => {
    for (const v of [undefined, "", "debug", "info", "warn", "error"])
      expect(logLevelProblem(v)).toBeUndefined();
    expect(logLevelProblem("verbose")).toBe(
      'LLMGW_LOG_LEVEL: "verbose" is not one of debug, info, warn, error',
    );
  });

  it("writes only lines at or above the level", () => {
    const lines: string[] = [];
    const log = createLogger({ part: "t" }, "warn", (l) => lines.push(l));
    log.info("quiet");
    log.warn("loud", { n: 1 });
    expect(lines.map((l) => JSON.parse(l))).toMatchObject([{ level: "warn", msg: "loud", part: "t", n: 1 }]);
  });

  it("stops a command that was given another value, before it runs", () => {
    const r = spawnSync(process.execPath, [LLMGW, "ctl", "status"], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "verbose" },
      encoding: "utf8",
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('llmgw: LLMGW_LOG_LEVEL: "verbose" is not one of');
  });
});
