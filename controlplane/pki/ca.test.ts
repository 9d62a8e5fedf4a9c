import { X509Certificate } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createCsr, sha256Hex, x509 } from "../../common/x509.ts";
import { CsrError, ensureServerCert, loadOrCreateCa, SERVER_VALIDITY_MS, signClientCsr } from "./ca.ts";

const dirs: string[] = [];
function dir(): string {
  const d = mkdtempSync(join(tmpdir(), "llmgw-pki-"));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe("control plane CA", () => {
  it("creates a P-256 CA once, 0600 key, and loads the same one again", async () => {
    const d = dir();
    const a = await loadOrCreateCa(d);
    expect(a.created).toBe(true);
    expect(statSync(join(d, "ca.key")).mode & 0o777).toBe(0o600);
    const cert = new X509Certificate(readFileSync(join(d, "ca.crt")));
    expect(cert.ca).toBe(true);
    expect(cert.publicKey.asymmetricKeyDetails?.namedCurve).toBe("prime256v1");
    expect(a.ca.fingerprint).toBe(sha256Hex(cert.raw));
    const b = await loadOrCreateCa(d);
    expect(b.created).toBe(false);
    expect(b.ca.fingerprint).toBe(a.ca.fingerprint);
  });

  it("refuses to replace a CA whose certificate is missing", async () => {
    const d = dir();
    await loadOrCreateCa(d);
    rmSync(join(d, "ca.crt"));
    await expect(loadOrCreateCa(d)).rejects.toThrow(/ca\.crt is missing/);
  });

  it("names a stored CA file it cannot use, and the way out", async () => {
    const d = dir();
    await loadOrCreateCa(d);
    writeFileSync(join(d, "ca.crt"), "-----BEGIN CERTIFICATE-----\ntruncated\n");
    await expect(loadOrCreateCa(d)).rejects.toThrow(
      /ca\.crt is not a usable certificate \(.*\): restore it from a backup/,
    );
    writeFileSync(join(d, "ca.key"), "not a key");
    await expect(loadOrCreateCa(d)).rejects.toThrow(/ca\.key is not a usable key/);
  });

  it("issues the server certificate with the configured SANs, and again only when due", async () => {
    const d = dir();
    const { ca } = await loadOrCreateCa(d);
    let t = Date.now();
    const now = () => t;
    const first = await ensureServerCert(ca, d, ["cp.example", "localhost", "127.0.0.1"], now);
    expect(first.issued).toBe("none stored");
    expect(statSync(join(d, "server.key")).mode & 0o777).toBe(0o600);
    const cert = new X509Certificate(first.certPem);
    expect(cert.subjectAltName).toBe("DNS:cp.example, DNS:localhost, IP Address:127.0.0.1");
    expect(cert.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    expect(cert.keyUsage).toContain("1.3.6.1.5.5.7.3.1");

    const again = await ensureServerCert(ca, d, ["localhost", "cp.example", "127.0.0.1"], now);
    expect(again.issued).toBeUndefined();
    expect(again.certPem).toBe(first.certPem);

    const renamed = await ensureServerCert(ca, d, ["cp2.example"], now);
    expect(renamed.issued).toMatch(/names changed/);

    t += SERVER_VALIDITY_MS - 86_400_000;
    const near = await ensureServerCert(ca, d, ["cp2.example"], now);
    expect(near.issued).toBe("near expiry");

    const other = await loadOrCreateCa(dir());
    const foreign = await ensureServerCert(other.ca, d, ["cp2.example"], now);
    expect(foreign.issued).toBe("not signed by the current CA");
  });

  it("signs a client certificate for the CSR's node name, for client auth only", async () => {
    const { ca } = await loadOrCreateCa(dir());
    const { keyPem, csrPem } = await createCsr("gpu-07");
    const t = Date.now();
    const pem = await signClientCsr(ca, csrPem, "gpu-07", 30 * 86_400_000, () => t);
    const cert = new X509Certificate(pem);
    expect(cert.subject).toBe("CN=gpu-07");
    expect(cert.ca).toBe(false);
    expect(cert.keyUsage).toEqual(["1.3.6.1.5.5.7.3.2"]);
    expect(cert.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    expect(cert.verify(new X509Certificate(ca.certPem).publicKey)).toBe(true);
    expect(Date.parse(cert.validTo)).toBeGreaterThan(t + 29 * 86_400_000);
    expect(Date.parse(cert.validTo)).toBeLessThanOrEqual(t + 30 * 86_400_000);
    // The certificate is for the CSR's key.
    const { createPrivateKey, createPublicKey } = await import("node:crypto");
    expect(createPublicKey(createPrivateKey(keyPem)).export({ type: "spki", format: "pem" })).toBe(
      cert.publicKey.export({ type: "spki", format: "pem" }),
    );
  });

  it("refuses a CSR for another name, a tampered CSR, and garbage", async () => {
    const { ca } = await loadOrCreateCa(dir());
    const { csrPem } = await createCsr("gpu-07");
    await expect(signClientCsr(ca, csrPem, "gpu-08", 86_400_000)).rejects.toThrow(
      /CN \("gpu-07"\) must equal the node name "gpu-08"/,
    );
    await expect(signClientCsr(ca, "not a csr", "gpu-07", 86_400_000)).rejects.toBeInstanceOf(CsrError);
    // A CSR whose subject was swapped after signing no longer verifies.
    const other = await createCsr("gpu-08");
    const a = new x509.Pkcs10CertificateRequest(csrPem);
    const b = new x509.Pkcs10CertificateRequest(other.csrPem);
    const raw = Buffer.from(a.rawData);
    const bSubject = Buffer.from(b.subjectName.toArrayBuffer());
    const aSubject = Buffer.from(a.subjectName.toArrayBuffer());
    const at = raw.indexOf(aSubject);
    expect(at).toBeGreaterThan(0);
    bSubject.copy(raw, at);
    const tampered = x509.PemConverter.encode(raw, "CERTIFICATE REQUEST");
    await expect(signClientCsr(ca, tampered, "gpu-08", 86_400_000)).rejects.toThrow(/does not verify/);
  });

  it("caps a client certificate at the CA's own expiry", async () => {
    const d = dir();
    const { ca } = await loadOrCreateCa(d);
    const { csrPem } = await createCsr("n1");
    const pem = await signClientCsr(ca, csrPem, "n1", 100 * 365 * 86_400_000);
    expect(Date.parse(new X509Certificate(pem).validTo)).toBeLessThanOrEqual(ca.cert.notAfter.getTime());
  });
});
