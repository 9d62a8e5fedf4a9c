import { describe, expect, it } from "vitest";
import { routerSitesSchema } from "../../edge/config/router-sites.ts";
import { MAX_SITES, parseStackOptions } from "./options.ts";
import { stackSitePreference, stackSites } from "./sites.ts";

describe("npm start's --sites", () => {
  const parse = (...argv: string[]) => {
    const o = parseStackOptions(argv, "/repo");
    if (o === "help") throw new Error("help");
    return o;
  };

  it("is one site, the default one laid out as before sites, without the flag", () => {
    const sites = stackSites(parse());
    expect(sites.map((s) => [s.name, s.adminPort, s.agentPort, s.adminTokenFile, s.siteTokenFile])).toEqual([
      ["default", 9090, 7443, "/repo/.state/admin.token", undefined],
    ]);
    expect(stackSites(parse("--sites", "1"))).toEqual(sites);
  });

  it("gives each site a name, the next ports, a state directory and, but for the first, a token of its own", () => {
    const sites = stackSites(parse("--sites", "2", "--admin-port", "9500", "--state-dir", "/s"));
    expect(sites.map((s) => [s.name, s.adminPort, s.agentPort, s.agentsDir, s.siteTokenFile])).toEqual([
      ["site-a", 9500, 7443, "/s/sites/site-a/agents", undefined],
      ["site-b", 9501, 7444, "/s/sites/site-b/agents", "/s/sites/site-b/edge.token"],
    ]);
    // Engines listen on their node's address: no two sites share one.
    const addresses = sites.flatMap((s) => s.nodes.map((n) => n.address));
    expect(new Set(addresses).size).toBe(4);
  });

  it("makes each site nearest one continent, the others after it: a router.sites the edge accepts", () => {
    const pref = stackSitePreference(stackSites(parse("--sites", "3")));
    expect(pref).toEqual({
      continents: {
        EU: ["site-a", "site-b", "site-c"],
        NA: ["site-b", "site-a", "site-c"],
        AS: ["site-c", "site-a", "site-b"],
      },
    });
    expect(routerSitesSchema.safeParse(pref).success).toBe(true);
  });

  it("refuses a count out of 1..MAX_SITES, or ports that would run past 65535, by name", () => {
    for (const bad of ["0", "-1", "two", "1.5", String(MAX_SITES + 1)])
      expect(() => parse(`--sites=${bad}`)).toThrow(
        `--sites: "${bad}" is not a number of sites from 1 to ${MAX_SITES}`,
      );
    expect(() => parse("--sites", "3", "--agent-port", "65534")).toThrow(
      "--agent-port: 65534 leaves no port for site 3 (65536 > 65535)",
    );
  });
});
