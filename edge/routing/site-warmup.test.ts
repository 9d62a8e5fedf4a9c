import { describe, expect, it } from "vitest";
import { SiteWarmup, siteHealth } from "./site-warmup.ts";

describe("a site's return, ramped", () => {
  it("is warm at once when first seen healthy: the ramp is for a return, not a beginning", () => {
    const w = new SiteWarmup();
    w.observe("eu", true, 1_000);
    expect(w.share("eu", 1_000, 30_000)).toBe(1);
    expect(w.warming(1_000, 30_000)).toEqual({});
  });

  it("grows a returning site's share linearly from 0 to 1 over the warm-up, on a fake clock", () => {
    const w = new SiteWarmup();
    w.observe("eu", true, 0);
    w.observe("eu", false, 10_000);
    w.observe("eu", false, 40_000);
    w.observe("eu", true, 60_000);
    expect(w.share("eu", 60_000, 30_000)).toBe(0);
    expect(w.share("eu", 67_500, 30_000)).toBe(0.25);
    w.observe("eu", true, 75_000); // still healthy: the ramp goes on from the return
    expect(w.share("eu", 75_000, 30_000)).toBe(0.5);
    expect(w.warming(75_000, 30_000)).toEqual({ eu: 0.5 });
    expect(w.share("eu", 90_000, 30_000)).toBe(1);
    expect(w.share("eu", 60_000, 0)).toBe(1);
  });

  it("starts over when the site is lost again mid-ramp", () => {
    const w = new SiteWarmup();
    w.observe("eu", false, 0);
    w.observe("eu", true, 1_000);
    w.observe("eu", false, 2_000);
    w.observe("eu", true, 5_000);
    expect(w.share("eu", 5_000, 10_000)).toBe(0);
  });

  it("counts a site healthy while one of its endpoints is routable with fresh load", () => {
    const h = siteHealth([
      { site: "eu", routable: true, stale: true },
      { site: "eu", routable: false, stale: false },
      { site: "us", routable: true, stale: true },
      { site: "us", routable: true, stale: false },
    ]);
    expect(Object.fromEntries(h)).toEqual({ eu: false, us: true });
  });
});
