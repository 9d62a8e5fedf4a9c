import { describe, expect, it } from "vitest";
import { parseAgentFlags } from "./flags.ts";

describe("agent flags", () => {
  it("holds the timer flags within their ranges, naming the flag", () => {
    const base = ["--control-plane", "http://127.0.0.1:7443", "--node", "n1"];
    expect(() => parseAgentFlags([...base, "--scrape-interval", "0s"])).toThrow(
      "--scrape-interval: must be between 100ms and 1h",
    );
    expect(() => parseAgentFlags([...base, "--ping-interval", "30d"])).toThrow(
      "--ping-interval: must be between 100ms and 1h",
    );
    const ok = parseAgentFlags([...base, "--scrape-interval", "250ms", "--stable-after", "0s"]);
    expect(ok !== "help" && [ok.scrapeIntervalMs, ok.stableAfterMs]).toEqual([250, 0]);
  });
});
