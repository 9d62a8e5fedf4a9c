import { describe, expect, it } from "vitest";
import { callerOf, parseSiteTokens, siteOfWrite } from "./caller.ts";

const T = (c: string) => c.repeat(20);

describe("parseSiteTokens", () => {
  it("takes a token or two per site", () => {
    expect(parseSiteTokens(JSON.stringify({ eu: T("a"), us: [T("b"), T("c")] }))).toEqual(
      new Map([
        ["eu", [T("a")]],
        ["us", [T("b"), T("c")]],
      ]),
    );
    expect(parseSiteTokens(undefined)).toEqual(new Map());
    expect(parseSiteTokens("")).toEqual(new Map());
  });

  it.each([
    ["{", 'EDGE_SYNC_SITE_TOKENS: not JSON; expected {"SITE": "TOKEN", …}'],
    [JSON.stringify({ eu: "short" }), "EDGE_SYNC_SITE_TOKENS.eu[0]: a site token: at least 16 characters"],
    [JSON.stringify({ EU: T("a") }), 'EDGE_SYNC_SITE_TOKENS: "EU": a site name: 1-32 lower-case letters'],
    [
      JSON.stringify({ eu: [T("a"), T("b"), T("c")] }),
      "EDGE_SYNC_SITE_TOKENS.eu: at most two tokens: the new one and the old one",
    ],
    [JSON.stringify({ eu: 7 }), "EDGE_SYNC_SITE_TOKENS.eu: a token, or a list of two while it is rotated"],
    [JSON.stringify([T("a")]), "EDGE_SYNC_SITE_TOKENS: "],
  ])("refuses %s, naming where", (raw, message) => {
    expect(() => parseSiteTokens(raw)).toThrow(message);
  });
});

describe("callerOf", () => {
  const sites = new Map([
    ["eu", [T("e")]],
    ["us", [T("u"), T("v")]],
  ]);
  it.each([
    [T("x"), { kind: "edge" }],
    [T("e"), { kind: "site", site: "eu" }],
    [T("v"), { kind: "site", site: "us" }],
    [T("z"), undefined],
  ])("%s is %j", async (presented, caller) => {
    expect(await callerOf(presented, [T("x")], sites)).toEqual(caller);
  });

  it("takes a token that is the edge's and a site's for the edge's", async () => {
    expect(await callerOf(T("e"), [T("e")], sites)).toEqual({ kind: "edge" });
  });
});

describe("siteOfWrite", () => {
  it("gives a site token its own site, and refuses another", () => {
    expect(siteOfWrite({ kind: "site", site: "eu" }, "", "endpoint set")).toBe("eu");
    expect(siteOfWrite({ kind: "site", site: "eu" }, "eu", "endpoint set")).toBe("eu");
    expect(() => siteOfWrite({ kind: "site", site: "eu" }, "us", "endpoint set")).toThrow(
      `site: this token is site "eu"'s, and cannot write site "us"'s endpoint set`,
    );
  });

  it("lets the edge's token write any site, the default one when it names none", () => {
    expect(siteOfWrite({ kind: "edge" }, "", "load")).toBe("default");
    expect(siteOfWrite({ kind: "edge" }, "us", "load")).toBe("us");
    expect(() => siteOfWrite({ kind: "edge" }, "US!", "load")).toThrow("site: a site name");
  });
});
