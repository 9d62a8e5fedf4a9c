import { describe, expect, it } from "vitest";
import { parseDuration } from "../../common/duration.ts";
import { ConfigError, parseConfig, startupGraceMs } from "./load.ts";

function issues(text: string, env: NodeJS.ProcessEnv = {}): string[] {
  try {
    parseConfig(text, "test.yaml", env);
  } catch (err) {
    if (err instanceof ConfigError) return err.issues;
    throw err;
  }
  return [];
}

describe("configuration loading", () => {
  it("runs on the design's defaults when the file is empty", () => {
    const { config } = parseConfig("", "(defaults)");
    expect(config.agent_listen).toBe(":7443");
    expect(config.admin_listen).toBe(":9090");
    expect(config.control).toMatchObject({
      interval: 5_000,
      base_backoff: 10_000,
      max_backoff: 600_000,
      unreachable_after: 15_000,
      lost_after: 60_000,
      port_range: [20000, 20999],
      mgmt_interface: "eth0",
    });
    expect(startupGraceMs(config)).toBe(60_000);
    expect(config.router).toMatchObject({
      scrape_interval: 2_000,
      stale_after: 10_000,
      retries: 2,
      cooldown: 15_000,
      failure_threshold: 3,
      session_header: "x-session-id",
      inject_usage: true,
      max_body_bytes: 32 * 1024 * 1024,
    });
    expect(config.router.timeouts).toEqual({
      response_header: 60_000,
      first_token: 120_000,
      idle: 60_000,
      total: 1_800_000,
    });
    expect(config.router.admission.bands.map((b) => [b.name, b.saturation_ceiling])).toEqual([
      ["platinum", 1],
      ["gold", 0.85],
      ["silver", 0.6],
      ["bronze", 0.3],
    ]);
  });

  it("overlays the file on the defaults, key by key", () => {
    const { config } = parseConfig(
      "control:\n  lost_after: 2m\nrouter:\n  timeouts:\n    idle: 500ms\n",
      "f",
    );
    expect(config.control.lost_after).toBe(120_000);
    expect(config.control.unreachable_after).toBe(15_000);
    expect(config.router.timeouts.idle).toBe(500);
    expect(config.router.timeouts.first_token).toBe(120_000);
  });

  it("applies LLMGW_ environment overrides with YAML typing, over the file", () => {
    const { config, envOverrides } = parseConfig("router:\n  retries: 1\n", "f", {
      LLMGW_CONTROL__LOST_AFTER: "8s",
      LLMGW_ROUTER__RETRIES: "3",
      LLMGW_ROUTER__INJECT_USAGE: "false",
      LLMGW_CONTROL__PORT_RANGE: "[21000, 21099]",
      // Not configuration: a secret and a log level share the prefix.
      LLMGW_EDGE_TOKEN: "s3cret",
      LLMGW_LOG_LEVEL: "debug",
    });
    expect(config.control.lost_after).toBe(8_000);
    expect(config.router.retries).toBe(3);
    expect(config.router.inject_usage).toBe(false);
    expect(config.control.port_range).toEqual([21000, 21099]);
    expect(envOverrides.sort()).toEqual(
      ["control.lost_after", "control.port_range", "router.inject_usage", "router.retries"].sort(),
    );
  });

  it("unsets a key with an empty override: the file's edge link off, a default back", () => {
    const { config, envOverrides } = parseConfig(
      "edge:\n  url: http://127.0.0.1:8787\ncontrol:\n  lost_after: 2m\n",
      "f",
      { LLMGW_EDGE__URL: "", LLMGW_CONTROL__LOST_AFTER: "" },
    );
    expect(config.edge.url).toBeUndefined();
    expect(config.control.lost_after).toBe(60_000);
    expect(envOverrides.sort()).toEqual(["control.lost_after (unset)", "edge.url (unset)"]);
  });

  it("names the path of every problem, all at once", () => {
    expect(
      issues("control:\n  lost_aftr: 5s\n  interval: 5\n  port_range: [30000, 20000]\nadmin_listen: nine\n"),
    ).toEqual(
      expect.arrayContaining([
        "control.lost_aftr: unknown key",
        'control.interval: a duration needs a unit: "5s", "5m" or "5ms" (a bare 5 could mean seconds or milliseconds)',
        "control.port_range: first port must not exceed the last",
        "admin_listen: must be HOST:PORT or :PORT",
      ]),
    );
    expect(issues("", { LLMGW_CONTROL__UNREACHABLE_AFTER: "soon" })).toEqual([
      expect.stringMatching(/^control\.unreachable_after: invalid duration "soon"/),
    ]);
    expect(issues("- a\n- b\n")).toEqual(["(root): must be a mapping of keys to values"]);
    expect(issues("control: [unclosed\n")[0]).toMatch(/^YAML: /);
  });

  it("checks a static endpoint's api_key_env in this process's environment, by path, never echoing a key", () => {
    const text = `endpoints:
  - { id: a, url: "http://10.0.1.50:8000", models: [m], api_key_env: LLMGW_KEY_A }
  - { id: b, url: "http://10.0.1.51:8000", models: [m], api_key_env: LLMGW_KEY_B }
models:
  - name: m
`;
    expect(issues(text, { LLMGW_KEY_A: "sk-engine-a" })).toEqual([
      "endpoints[1].api_key_env: LLMGW_KEY_B is not set",
    ]);
    expect(issues(text, { LLMGW_KEY_A: "sk-engine-a", LLMGW_KEY_B: "two words" }).join("\n")).not.toContain(
      "two words",
    );
    expect(issues(text, { LLMGW_KEY_A: "sk-engine-a", LLMGW_KEY_B: "sk-engine-b" })).toEqual([]);
  });

  it("names the site, the default one when the file names none, and refuses a name that is not one", () => {
    expect(parseConfig("", "(defaults)").config.site).toBe("default");
    expect(parseConfig("site: eu-west\n", "test.yaml").config.site).toBe("eu-west");
    expect(issues("site: EU West\n")).toEqual([
      "site: a site name: 1-32 lower-case letters, digits or dashes, not starting with a dash",
    ]);
  });

  it("holds every duration that drives a timer within its range: no zero period, nothing past Node's timers", () => {
    expect(
      issues(
        "control:\n  interval: 0s\n  heartbeat_interval: 30d\nrouter:\n  timeouts:\n    idle: 0s\n  scrape_interval: 0s\n",
      ),
    ).toEqual(
      expect.arrayContaining([
        "control.interval: must be between 100ms and 1h",
        "control.heartbeat_interval: must be between 100ms and 1h",
        "router.timeouts.idle: must be between 10ms and 24h",
        "router.scrape_interval: must be between 100ms and 1h",
      ]),
    );
    expect(issues("control:\n  interval: 100ms\n  startup_grace: 0s\n")).toEqual([]);
  });

  it("reads durations as operators write them", () => {
    expect(parseDuration("500ms")).toBe(500);
    expect(parseDuration("15s")).toBe(15_000);
    expect(parseDuration("1h30m")).toBe(5_400_000);
    expect(parseDuration("0")).toBe(0);
    expect(() => parseDuration("15")).toThrow(/invalid duration/);
    expect(() => parseDuration("5 s")).toThrow(/invalid duration/);
  });
});
