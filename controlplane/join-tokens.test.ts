import { describe, expect, it } from "vitest";
import { formatJoinToken, parseJoinToken } from "../common/join-token.ts";
import { JoinTokenStore } from "./join-tokens.ts";

describe("join token store", () => {
  it("accepts a token until its uses run out, then says it is used up", () => {
    const s = new JoinTokenStore(":memory:");
    const { secret, expiresAt } = s.create(60_000, 2, 1_000);
    expect(expiresAt).toBe(61_000);
    expect(s.check(secret, 2_000)).toEqual({ ok: true, usesLeft: 2, expiresAt: 61_000 });
    expect(s.consume(secret, 2_000, "a")).toMatchObject({ ok: true, usesLeft: 1 });
    expect(s.consume(secret, 2_000, "b")).toMatchObject({ ok: true, usesLeft: 0 });
    expect(s.consume(secret, 2_000, "c")).toMatchObject({ ok: false, reason: "used_up" });
    expect(s.check(secret, 2_000)).toMatchObject({ ok: false, reason: "used_up" });
  });

  it("refuses expired and unknown tokens with different reasons", () => {
    const s = new JoinTokenStore(":memory:");
    const { secret } = s.create(1_000, 1, 0);
    expect(s.consume(secret, 1_000, "a")).toMatchObject({ ok: false, reason: "expired" });
    expect(s.check("x".repeat(43), 0)).toMatchObject({ ok: false, reason: "unknown" });
  });

  it("stores only a hash of the secret", () => {
    const s = new JoinTokenStore(":memory:");
    const { secret } = s.create(1_000, 1, 0);
    const db = (s as unknown as { db: import("node:sqlite").DatabaseSync }).db;
    const rows = db.prepare("SELECT * FROM join_tokens").all();
    expect(rows).toHaveLength(1);
    expect(JSON.stringify(rows)).not.toContain(secret);
    expect(String(rows[0]!.hash)).toMatch(/^[0-9a-f]{64}$/);
  });

  it("bounds ttl and uses", () => {
    const s = new JoinTokenStore(":memory:");
    expect(() => s.create(0, 1, 0)).toThrow(/ttl/);
    expect(() => s.create(1_000, 0, 0)).toThrow(/uses/);
    expect(() => s.create(1_000, 1.5, 0)).toThrow(/uses/);
  });

  it("prunes tokens a day past expiry", () => {
    const s = new JoinTokenStore(":memory:");
    const { secret } = s.create(1_000, 1, 0);
    s.prune(1_000 + 86_400_001);
    expect(s.check(secret, 0)).toMatchObject({ ok: false, reason: "unknown" });
  });
});

describe("join token format", () => {
  const fp = "ab".repeat(32);
  it("round-trips secret and CA fingerprint", () => {
    const t = formatJoinToken({ secret: "s3cr3t-secret_value", fingerprint: fp });
    expect(parseJoinToken(` ${t}\n`)).toEqual({ secret: "s3cr3t-secret_value", fingerprint: fp });
  });
  it("refuses anything else with a message naming the format", () => {
    for (const bad of ["", "abc", `short.${fp}`, "s3cr3t-secret_value.abcd", `s3cr3t secret.${fp}`])
      expect(() => parseJoinToken(bad)).toThrow(/malformed join token/);
  });
});
