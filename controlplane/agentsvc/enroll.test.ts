import { X509Certificate } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger } from "../../common/log.ts";
import { createCsr } from "../../common/x509.ts";
import { EnrollRequestSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { CertificateStore, certFacts } from "../certificates.ts";
import { JoinTokenStore } from "../join-tokens.ts";
import { type Ca, loadOrCreateCa } from "../pki/ca.ts";
import { Enrollment } from "./enroll.ts";

const req = (r: { token: string; nodeName: string; csrPem: string }) => create(EnrollRequestSchema, r);

describe("Enroll", () => {
  let dir: string;
  let ca: Ca;
  let other: Ca;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "llmgw-enroll-"));
    ca = (await loadOrCreateCa(join(dir, "a"))).ca;
    other = (await loadOrCreateCa(join(dir, "b"))).ca;
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const make = (o: { certs?: CertificateStore; perMinute?: number; now?: () => number } = {}) =>
    new Enrollment({
      ca,
      tokens: new JoinTokenStore(":memory:"),
      certs: o.certs ?? new CertificateStore(":memory:"),
      clientCertValidityMs: 86_400_000,
      defaultTokenTtlMs: 3_600_000,
      ...(o.perMinute ? { enrollPerMinute: o.perMinute } : {}),
      ...(o.now ? { now: o.now } : {}),
      log: createLogger({}, "error"),
    });
  const refused = async (p: Promise<unknown>, code: Code, message: RegExp) => {
    const err = await p.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(code);
    expect((err as ConnectError).rawMessage).toMatch(message);
  };

  it("signs a certificate for the node and spends the token", async () => {
    const e = make();
    const { token, uses, caFingerprint } = e.createToken(0, 0);
    expect(uses).toBe(1);
    expect(token.endsWith(`.${ca.fingerprint}`)).toBe(true);
    expect(caFingerprint).toBe(ca.fingerprint);
    const { csrPem } = await createCsr("gpu-1");
    const res = await e.enroll(req({ token, nodeName: "gpu-1", csrPem }));
    expect(new X509Certificate(res.certPem).subject).toBe("CN=gpu-1");
    expect(res.caPem).toBe(ca.certPem);
    await refused(
      e.enroll(req({ token, nodeName: "gpu-1", csrPem })),
      Code.PermissionDenied,
      /already been used up/,
    );
    expect(e.stats).toEqual({ enrolled: 1, renewed: 0, refused: { token_used_up: 1 } });
  });

  it("does not spend the token on a bad CSR or a bad node name", async () => {
    const e = make();
    const { token } = e.createToken(60_000, 1);
    const { csrPem } = await createCsr("gpu-2");
    await refused(
      e.enroll(req({ token, nodeName: "gpu-3", csrPem })),
      Code.InvalidArgument,
      /must equal the node name "gpu-3"/,
    );
    await refused(
      e.enroll(req({ token, nodeName: "../etc", csrPem })),
      Code.InvalidArgument,
      /node name must be/,
    );
    await e.enroll(req({ token, nodeName: "gpu-2", csrPem }));
  });

  it("refuses a token pinning another CA, a malformed one and an unknown one", async () => {
    const e = make();
    const { token } = e.createToken(60_000, 1);
    const { csrPem } = await createCsr("gpu-4");
    const foreign = `${token.split(".")[0]}.${other.fingerprint}`;
    await refused(
      e.enroll(req({ token: foreign, nodeName: "gpu-4", csrPem })),
      Code.PermissionDenied,
      /from another control plane/,
    );
    await refused(
      e.enroll(req({ token: "nope", nodeName: "gpu-4", csrPem })),
      Code.PermissionDenied,
      /malformed join token/,
    );
    await refused(
      e.enroll(req({ token: `${"y".repeat(43)}.${ca.fingerprint}`, nodeName: "gpu-4", csrPem })),
      Code.PermissionDenied,
      /not known/,
    );
  });

  it("bounds what CreateJoinToken accepts", () => {
    const e = make();
    expect(() => e.createToken(400 * 86_400_000, 1)).toThrow(/at most 365d/);
    expect(() => e.createToken(1_000, 20_000)).toThrow(/uses must be between/);
  });

  it("limits Enroll calls per source address, IPv6 per /64, and says when to retry", async () => {
    let t = 1_000_000;
    const e = make({ perMinute: 2, now: () => t });
    const { csrPem } = await createCsr("gpu-5");
    const bad = req({ token: "nope", nodeName: "gpu-5", csrPem });
    const a = { address: "10.0.0.1" };
    await refused(e.enroll(bad, a), Code.PermissionDenied, /malformed/);
    await refused(e.enroll(bad, a), Code.PermissionDenied, /malformed/);
    await refused(
      e.enroll(bad, a),
      Code.ResourceExhausted,
      /too many Enroll calls from 10\.0\.0\.1.*retry in 30s/,
    );
    // Another address has its own budget; two of one /64 share one.
    await refused(e.enroll(bad, { address: "10.0.0.2" }), Code.PermissionDenied, /malformed/);
    await refused(e.enroll(bad, { address: "2001:db8::1" }), Code.PermissionDenied, /malformed/);
    await refused(e.enroll(bad, { address: "2001:db8::2" }), Code.PermissionDenied, /malformed/);
    await refused(
      e.enroll(bad, { address: "2001:db8:0:0:ffff::3" }),
      Code.ResourceExhausted,
      /2001:db8:0:0::\/64/,
    );
    // A token back after half a minute at two a minute.
    t += 30_000;
    await refused(e.enroll(bad, a), Code.PermissionDenied, /malformed/);
    expect(e.stats.refused.rate_limited).toBe(2);
  });

  it("records what it issues, refuses a revoked certificate, renews once a minute at most", async () => {
    let t = Date.now();
    const certs = new CertificateStore(":memory:");
    const e = make({ certs, now: () => t });
    const { token } = e.createToken(60_000, 1);
    const first = await createCsr("gpu-6");
    const { certPem } = await e.enroll(req({ token, nodeName: "gpu-6", csrPem: first.csrPem }));
    const facts = certFacts(certPem);
    expect(certs.knows("gpu-6")).toBe(true);

    const renewed = await e.renew(facts, (await createCsr("gpu-6", first.keyPem)).csrPem);
    expect("certPem" in renewed && certFacts(renewed.certPem).node).toBe("gpu-6");
    expect(await e.renew(facts, first.csrPem)).toEqual({ refused: expect.stringMatching(/renewed 0s ago/) });
    t += 61_000;
    expect(await e.renew(facts, (await createCsr("gpu-7")).csrPem)).toEqual({
      refused: expect.stringMatching(/must equal the node name "gpu-6"/),
    });
    t += 61_000;
    expect(await e.renew({ ...facts, notAfter: t - 1 }, first.csrPem)).toEqual({
      refused: expect.stringMatching(/expired at .*new join token/),
    });

    // Revoking the node revokes both certificates it holds.
    expect(certs.revokeNode("gpu-6", t)).toHaveLength(2);
    expect(certs.revokedNodes().get("gpu-6")).toBe(t);
    t += 61_000;
    expect(await e.renew(facts, first.csrPem)).toEqual({ refused: "this certificate is revoked" });
    const again = e.createToken(60_000, 1);
    await refused(
      e.enroll(req({ token: again.token, nodeName: "gpu-6", csrPem: first.csrPem }), { cert: facts }),
      Code.PermissionDenied,
      /is revoked/,
    );
    // Without the revoked certificate, a new token re-admits the node.
    await e.enroll(req({ token: again.token, nodeName: "gpu-6", csrPem: first.csrPem }));
    expect(certs.revokedNodes().has("gpu-6")).toBe(false);
  });
});
