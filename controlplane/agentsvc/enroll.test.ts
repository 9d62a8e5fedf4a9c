import { X509Certificate } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger } from "../../common/log.ts";
import { EnrollRequestSchema } from "../../proto/gen/agent/v1/agent_pb.ts";
import { JoinTokenStore } from "../join-tokens.ts";
import { type Ca, loadOrCreateCa } from "../pki/ca.ts";
import { createCsr } from "../pki/x509.ts";
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

  const make = () =>
    new Enrollment({
      ca,
      tokens: new JoinTokenStore(":memory:"),
      clientCertValidityMs: 86_400_000,
      defaultTokenTtlMs: 3_600_000,
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
    expect(e.stats).toEqual({ enrolled: 1, refused: { token_used_up: 1 } });
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
});
