import { describe, expect, it } from "vitest";
import { freePort, freePortBlock } from "./free-ports.ts";

describe("free ports", () => {
  it("never hands the same port twice, asked all at once, and none in the kernel's ephemeral range", async () => {
    const ports = await Promise.all(Array.from({ length: 200 }, () => freePort()));
    expect(new Set(ports).size).toBe(200);
    for (const p of ports) expect(p).toBeLessThan(32_768);
  });

  it("hands out consecutive blocks that overlap neither each other nor a single port", async () => {
    const [a, b, one] = await Promise.all([freePortBlock(100), freePortBlock(100), freePort()]);
    expect(a).toEqual(Array.from({ length: 100 }, (_, k) => a[0]! + k));
    const all = new Set([...a, ...b, one]);
    expect(all.size).toBe(201);
  });
});
